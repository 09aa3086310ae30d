# The learners' image, built by the script tools/classroom.py writes: the quick-start's CANN image with what every
# lesson needs: the torch + torch_npu pair it was validated with (requirements-npu.txt, through tools/install.py --npu:
# on x86_64 torch 2.9.0+cpu from PyTorch's CPU index, which the wheelhouse of an offline build must hold), then the series itself
# (/opt/series, installed with -e), JupyterLab (requirements.txt: in a container there is no platform JupyterLab)
# and deepspeed (requirements-deepspeed.txt: 08's ZeRO checks), installed by tools/install.py, which holds that pair.
# Not built in CI: there is no Ascend host there. The context is the repository (.dockerignore keeps out .git, the
# venvs, outputs and the classroom scripts, which hold the learners' tokens).
# BASE has no default: tools/classroom.py passes the quick-start's image (nbtools/floors.py, the one copy); without
# it the build fails at FROM.
ARG BASE
FROM ${BASE}
# Offline (tools/classroom.py --wheelhouse): "--no-index --find-links /opt/series/wheelhouse", the repository's
# wheelhouse/ made for this image's architecture and Python (docs/teaching.md, 2b). Empty: pip uses its index.
ARG PIP_ARGS=""
COPY . /opt/series
WORKDIR /opt/series
RUN python3 tools/install.py --npu --no-cache-dir ${PIP_ARGS}
RUN python3 tools/install.py -r requirements.txt -r requirements-deepspeed.txt --no-cache-dir ${PIP_ARGS}
WORKDIR /home/ma-user/work
