# The learners' image, built once by the script tools/classroom.py writes: the quick-start's CANN image, the
# torch + torch_npu pair it was validated with, the series' requirements (JupyterLab included: in a container
# there is no platform JupyterLab). Not built in CI: there is no Ascend host there.
# BASE has no default: tools/classroom.py passes its BASE (the one copy); without it the build fails at FROM.
ARG BASE
FROM ${BASE}
COPY requirements-npu.txt requirements.txt requirements-learner.txt /opt/series/
RUN python3 -m pip install --no-cache-dir -r /opt/series/requirements-npu.txt
WORKDIR /home/ma-user/work
