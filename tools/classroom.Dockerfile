# The learners' image, built once by the script tools/classroom.py writes: the quick-start's CANN image, the
# torch + torch_npu pair it was validated with, the series' requirements (JupyterLab included: in a container
# there is no platform JupyterLab). Not built in CI: there is no Ascend host there.
ARG BASE=swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:9.1.0-910b-ubuntu22.04-py3.12
FROM ${BASE}
COPY requirements-npu.txt requirements.txt requirements-learner.txt /opt/series/
RUN python3 -m pip install --no-cache-dir -r /opt/series/requirements-npu.txt
WORKDIR /home/ma-user/work
