# Sourced (POSIX sh) by the Dockerfile's RUN steps that install with pip: where packages come from.
#   OFFLINE=1      only the wheelhouse bind-mounted at /wheels (docker/wheels/ of the context)
#   OFFLINE=0      the index: PIP_INDEX_URL when the build got one, else pip's default
#   /run/secrets/hostca  (BuildKit secret `hostca`, if given) the CA bundle pip trusts
if [ "${OFFLINE:-0}" = 1 ]; then
  if ! ls /wheels/*.whl > /dev/null 2>&1; then
    echo "OFFLINE=1, but docker/wheels/ holds no wheels: fill it (scripts/docker_image.sh does)" >&2
    exit 1
  fi
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels
  unset PIP_INDEX_URL
elif [ -n "${PIP_INDEX_URL:-}" ]; then
  export PIP_INDEX_URL
else
  unset PIP_INDEX_URL
fi
if [ -s /run/secrets/hostca ]; then export PIP_CERT=/run/secrets/hostca; fi
