"""When does compression pay? A step-time model of BytePS training with THC and the alternatives.

    python -m byteps_thc.advisor --model resnet50 --bandwidth 1,10,25 --workers 8

The modules import each other one way only, each from those above it:

    models     the gradient shapes of known models (and their published step times)
    wire       CompressorSpec, parse_spec; BytePS's partitions and the bytes each compressor sends
    costs      HostCosts: per-element costs measured on this host, one partition's CPU
    predict    Scenario -> Prediction per compressor; recommend
    replay     the worker loop that push_pulls synthetic gradients through the real stack
    calibrate  calibration clusters of the real stack (replay workers): the stack's costs
    host       host_costs(): measure (costs + calibrate) once, cache per host
    cli        the command line (`python -m byteps_thc.advisor`)

This file imports none of them, so that `python -m byteps_thc.advisor.<module>` runs a module
once; import what you need from its module (e.g. `from byteps_thc.advisor.predict import
predict`).
"""
