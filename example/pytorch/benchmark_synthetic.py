"""Synthetic-data throughput of BytePS training with ResNet-50 or VGG-16, built in plain torch.

    bpslaunch --local 2 -- python example/pytorch/benchmark_synthetic.py --compressor none
    bpslaunch --local 2 -- python example/pytorch/benchmark_synthetic.py --compressor thc

The models have the real architectures and parameter shapes (ResNet-50: 25.6 M parameters,
VGG-16: 138 M); the images are random and small by default (--image-size 64; the adaptive
pooling keeps VGG's 25088-wide classifier input at any size), so that the run is dominated by
gradient communication, which is what compression changes. Prints samples/s (per worker and in
total) and the bytes that crossed the loopback interface per step (measured, /proc/net/dev:
meaningful when the cluster is alone on lo, e.g. inside `unshare -n`, as scripts/demo.py does).
Without a BytePS launcher (no DMLC_ROLE) it measures one process's compute only.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from example import common


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.down = None
        if stride != 1 or inplanes != planes * self.expansion:
            self.down = nn.Sequential(
                nn.Conv2d(inplanes, planes * self.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * self.expansion))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        layers, inplanes = [], 64
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
                inplanes = planes * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class VGG16(nn.Module):
    CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, c = [], 3
        for v in self.CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), 7)
        return self.classifier(torch.flatten(x, 1))


MODELS = {"resnet50": ResNet50, "vgg16": VGG16}


def main(argv=None):
    args = common.benchmark_parser(__doc__, MODELS).parse_args(argv)
    bps, distributed = common.start("torch")
    rank, size = bps.rank(), bps.size()
    torch.manual_seed(0)
    model = MODELS[args.model]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    comp = "none (single process)"
    if distributed:
        opt = bps.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=common.choose_compression(bps, args))
        comp = repr(opt._compression)
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
    n_params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        common.print_model(args, n_params, size, comp)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    return common.benchmark(bps, distributed, args, step, comp, n_params)


if __name__ == "__main__":
    sys.exit(main())
