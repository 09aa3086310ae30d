"""The ``torch.ops.npu`` operators of the real torch_npu that lessons and libraries call, with the real schemas
(simnpu/api/, from the wheel's npu_native_functions yamls); ``torch_npu`` binds them as the real one does.

Simulated: the internal-format ops. A card keeps a tensor in an internal layout (ND = 2, NZ = 29, ...); here the
bytes stay plain, the format is only remembered, so a cast keeps the values and ``get_npu_format`` answers what was
asked. Refused by name: the fused kernels, which only a card runs."""
import types

import torch

ND = 2   # ACL_FORMAT_ND, every plain tensor's format

_LIB = torch.library.Library("npu", "DEF")
SCHEMAS = [
    "get_npu_format(Tensor self) -> int",
    "npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None, int? input_dtype=None) -> Tensor",
    "npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, int? input_dtype=None) -> Tensor",
    "npu_format_cast_(Tensor(a!) self, Tensor src, *, int? customize_dtype=None, int? input_dtype=None) -> Tensor(a!)",
    "npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, int? customize_dtype=None, "
    "int? input_dtype=None) -> Tensor(a!)",
    "empty_with_format(int[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, int acl_format=2, int? base_addr_aligned_kb=None) -> Tensor",
    "npu_prompt_flash_attention(Tensor query, Tensor key, Tensor value, *, Tensor? padding_mask=None, "
    "Tensor? atten_mask=None, Tensor? pse_shift=None, int[]? actual_seq_lengths=None, Tensor? deq_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? deq_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
    "int num_heads=1, float scale_value=1.0, int pre_tokens=2147483647, int next_tokens=0, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int[]? actual_seq_lengths_kv=None, int sparse_mode=0) -> Tensor",
]
for _schema in SCHEMAS:
    _LIB.define(_schema)


def _format(t):
    return getattr(t, "_simnpu_acl_format", ND)


def _with_format(t, acl_format):
    t._simnpu_acl_format = int(acl_format)
    return t


def _cast(self, acl_format, customize_dtype=None, input_dtype=None):
    return self if _format(self) == acl_format else _with_format(self.clone(), acl_format)


_LIB.impl("get_npu_format", _format, "PrivateUse1")
_LIB.impl("npu_format_cast", _cast, "PrivateUse1")
_LIB.impl("npu_format_cast.Tensor", lambda self, dst, **kw: _cast(self, _format(dst)), "PrivateUse1")
_LIB.impl("npu_format_cast_", lambda self, src, **kw: _with_format(self, _format(src)), "PrivateUse1")
_LIB.impl("npu_format_cast_.acl_format", lambda self, acl_format, **kw: _with_format(self, acl_format), "PrivateUse1")
_LIB.impl("empty_with_format", lambda size, *, dtype=None, layout=None, device=None, pin_memory=None, acl_format=2,
          base_addr_aligned_kb=None: _with_format(torch.empty(size, dtype=dtype, layout=layout, device=device,
                                                               pin_memory=bool(pin_memory)), acl_format),
          "CompositeExplicitAutograd")


def _refused(name):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"torch_npu.{name} (Ascend's fused kernel) is not simulated by the simulated NPU: "
                                  "it runs only on a real Ascend card")
    return kernel


_LIB.impl("npu_prompt_flash_attention", _refused("npu_prompt_flash_attention"), "PrivateUse1")


class _CExtension(types.ModuleType):
    """``torch_npu._C`` (the real one's C extension): its names are a card's runtime, not simulated."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"torch_npu._C.{name} is not simulated by the simulated NPU: the real torch_npu's C "
                             "extension runs only with CANN on an Ascend host")


def c_extension():
    return _CExtension("torch_npu._C")
