"""torch.compile's default backend (inductor) for the simulated NPU: npu memory is host memory, so inductor's CPU
code generator serves device ``npu`` (the real torch_npu registers its own generator for Ascend). Registered when
inductor's codegen registry is first imported (an import hook), not at ``import torch_npu``: importing inductor
costs about 2 s, which every process would pay."""
import importlib.abc
import importlib.util
import sys

_REGISTRY = "torch._inductor.codegen.common"


def _register(common):
    from torch._dynamo.device_interface import CpuInterface, register_interface_for_device
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    class NpuWrapperCodegen(PythonWrapperCodegen):
        """The CPU wrapper, whose kernel calls it also writes for device npu."""

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return PythonWrapperCodegen.create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures)
            return NpuWrapperCodegen()

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
            from torch._inductor.virtualized import V

            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type == "npu":
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return None
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton,
                                                        **kwargs)

    class NpuDeviceOpOverrides(CpuDeviceOpOverrides):
        """The CPU's, plus the card switches a graph over several cards needs."""

        def set_device(self, device_idx):
            return f"torch.npu.set_device({device_idx})"

        def synchronize(self):
            return "torch.npu.synchronize()"

        def device_guard(self, device_idx):
            return f"torch.npu.device({device_idx})"

    common.register_backend_for_device("npu", CppScheduling, NpuWrapperCodegen)
    common.register_device_op_overrides("npu", NpuDeviceOpOverrides())
    register_interface_for_device("npu", CpuInterface)


def _register_at_backend_registration(common):
    """Inductor registers its devices' backends in init_backend_registration(), called before it compiles; the npu
    one is added there too (its modules then import without a cycle)."""
    original = common.init_backend_registration

    def init_backend_registration():
        original()
        if common.get_scheduling_for_device("npu") is None:
            _register(common)

    common.init_backend_registration = init_backend_registration


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _REGISTRY:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]
            _register_at_backend_registration(module)

        spec.loader.exec_module = exec_module
        return spec


def install():
    if _REGISTRY in sys.modules:
        _register(sys.modules[_REGISTRY])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
