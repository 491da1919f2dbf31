"""float32 matmuls through MKL's sgemm, as an XLA FFI custom call on the CPU backend, with its own gradient.

On Intel Xeon hosts XLA:CPU's dot kernels run SmolLM2's matmuls slower than the MKL build torch ships, and those
matmuls are most of the learner's step, so Flax lost to torch eager there. This module gives the learner torch's
kernel without torch's runtime: `csrc/mkl_matmul.cc` is a small XLA FFI handler that calls MKL's ILP64 `sgemm` and
`sgemm_batch` through function pointers taken from torch's `libtorch_cpu` (nothing is linked), built on first use with
the host's C++ compiler against jaxlib's FFI headers and cached under `$XDG_CACHE_HOME/conductor-rl/kernels/`.
docs/decisions/031-mkl-matmul-on-intel-cpus.md has the measurements and the choice of hosts.

- `matmul(a, b, transpose_a, transpose_b)`: op(a) @ op(b) for float32 matrices or batches of them, differentiable.
- `dot_general`: a drop-in for `jax.lax.dot_general` (`nnx.Linear(dot_general=...)`) that takes the kernel for a
  float32 `[..., in] x [in, out]` product and XLA's dot for every other contraction.
- `unavailable_reason()`: why the kernel cannot run in this process, or None. It covers the attention handlers of
  `models.mkl_attention` too (`csrc/mkl_attention.cc`), which are built and registered here beside the matmul.
- `resolve(implementation, dtype)`: "auto" -> "mkl" or "xla" (see `ModelConfig.matmul_implementation`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import jaxlib

from models import zoo
from models.config import MATMUL_IMPLEMENTATIONS

_FFI_TARGET = "conductor_mkl_matmul"
ATTENTION_FORWARD_TARGET = "conductor_mkl_attention_forward"
ATTENTION_BACKWARD_TARGET = "conductor_mkl_attention_backward"


class _Library(NamedTuple):
    """One handler library: its source, extra compiler flags, the function that takes MKL's entry points (named
    by their libtorch_cpu symbols, in its argument order) and the FFI targets it defines, by handler symbol."""

    source: str
    flags: tuple[str, ...]
    setter: str
    mkl_symbols: tuple[str, ...]
    targets: dict[str, str]


# MKL's ILP64 entry points (64-bit integers), which x86-64 torch CPU builds export from libtorch_cpu.
_LIBRARIES = (
    _Library("mkl_matmul.cc", (), "mkl_matmul_set_kernels", ("sgemm_64_", "sgemm_batch_64_"),
             {_FFI_TARGET: "MklMatmul"}),
    # OpenMP: the attention handlers spread their items over threads. libgomp is the runtime torch's MKL uses, and
    # the loader binds this library to the copy torch loaded (same soname), so there is one thread runtime. The
    # softmax loops are vectorised for this CPU, which is why a build is cached per CPU; without
    # -fno-trapping-math GCC keeps their masked selects scalar (no trap is ever enabled in this process).
    _Library("mkl_attention.cc", ("-fopenmp", "-march=native", "-fno-trapping-math"), "mkl_attention_set_kernels",
             ("sgemm_64_", "MKL_Set_Num_Threads_Local"),
             {ATTENTION_FORWARD_TARGET: "MklAttentionForward", ATTENTION_BACKWARD_TARGET: "MklAttentionBackward"}),
)


@functools.cache
def cpuinfo_fields(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (they hold for every processor); {} where the file
    cannot be read (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo) as lines:
            for line in lines:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return {}
    return fields


def _compiler() -> str | None:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _build_kernel(library: _Library) -> pathlib.Path:
    """The compiled handler library, built once per source, flags, jaxlib version and CPU (a cache on a shared home
    directory may serve several kinds of host); concurrent builders each write a private file and rename it into
    place, so a reader never sees a half-written library."""
    source_path = pathlib.Path(__file__).with_name("csrc") / library.source
    flags = library.flags
    cpu = cpuinfo_fields().get("model name", "") + cpuinfo_fields().get("flags", "")
    key = hashlib.sha256(b"\0".join([source_path.read_bytes(), " ".join(flags).encode(), jaxlib.__version__.encode(),
                                      cpu.encode()])).hexdigest()[:16]
    built = zoo.cache_root() / "kernels" / f"{source_path.stem}-{key}.so"
    if built.exists():
        return built
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++, c++ or clang++ on PATH, or $CXX) to build the kernel with")
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent, prefix=".build-") as staging:
        staged = pathlib.Path(staging) / built.name
        command = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", *flags, "-isystem", jax.ffi.include_dir(),
                   str(source_path), "-o", str(staged)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"building the kernel failed ({' '.join(command)}):\n{result.stderr[-2000:]}")
        os.replace(staged, built)
    return built


def _torch_cpu_library() -> pathlib.Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise RuntimeError("torch is not installed, and its libtorch_cpu is where MKL comes from")
    library = pathlib.Path(spec.origin).parent / "lib" / "libtorch_cpu.so"
    if not library.exists():
        raise RuntimeError(f"no {library} (torch's Linux CPU library)")
    return library


@functools.cache
def _register() -> str | None:
    """Builds, loads and registers the kernels (matmul and attention) once per process; returns why it failed, or
    None. torch's library is loaded first, so the handler libraries find its OpenMP runtime already loaded."""
    try:
        mkl = ctypes.CDLL(str(_torch_cpu_library()))
        missing = [symbol for library in _LIBRARIES for symbol in library.mkl_symbols if not hasattr(mkl, symbol)]
        if missing:
            return f"torch's libtorch_cpu exports no {', '.join(sorted(set(missing)))}: this torch build has no MKL"
        handlers = [ctypes.CDLL(str(_build_kernel(library))) for library in _LIBRARIES]
    except (OSError, RuntimeError) as error:
        return str(error)
    for library, handler in zip(_LIBRARIES, handlers):
        entry_points = (ctypes.cast(getattr(mkl, symbol), ctypes.c_void_p) for symbol in library.mkl_symbols)
        getattr(handler, library.setter)(*entry_points)
        for target, symbol in library.targets.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(handler, symbol)), platform="cpu")
    return None


def unavailable_reason() -> str | None:
    """Why `matmul` cannot run in this process (no torch with MKL, no C++ compiler, ...), or None when it can."""
    return _register()


def resolve(implementation: str, dtype: Any) -> str:
    """"xla" or "mkl" for a model computing in `dtype`.

    "auto" takes MKL only where it was measured faster than XLA:CPU's dot: a float32 model, on the CPU backend, on
    an Intel CPU (on AMD EPYC hosts torch's MKL runs these shapes well below XLA), in a process whose computations
    use one device (the custom call has no sharding rule, so a mesh would gather every operand). "mkl" insists, and
    fails with the reason where the kernel cannot run.
    """
    if implementation not in MATMUL_IMPLEMENTATIONS:
        raise ValueError(f"matmul_implementation must be one of {MATMUL_IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "mkl":
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"matmul_implementation='mkl' cannot run here: {reason}")
        return "mkl"
    if implementation == "xla":
        return "xla"
    suited = (
        jnp.dtype(dtype) == jnp.float32
        and jax.default_backend() == "cpu"
        and jax.device_count() == 1
        and cpuinfo_fields().get("vendor_id") == "GenuineIntel"
    )
    return "mkl" if suited and unavailable_reason() is None else "xla"


def _ffi_matmul(a: jax.Array, b: jax.Array, transpose_a: bool, transpose_b: bool) -> jax.Array:
    """The custom call on `[batch, rows, columns]` operands; 2-D operands are a batch of one."""
    if a.ndim == 2:
        return _ffi_matmul(a[None], b[None], transpose_a, transpose_b)[0]
    rows = a.shape[2] if transpose_a else a.shape[1]
    columns = b.shape[1] if transpose_b else b.shape[2]
    result = jax.ShapeDtypeStruct((a.shape[0], rows, columns), jnp.float32)
    return jax.ffi.ffi_call(_FFI_TARGET, result)(a, b, transpose_a=transpose_a, transpose_b=transpose_b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul(a: jax.Array, b: jax.Array, transpose_a: bool = False, transpose_b: bool = False) -> jax.Array:
    """op(a) @ op(b) for float32 `a`, `b`, where op transposes a matrix's last two axes when its flag is set: two
    matrices, or two `[batch, ...]` stacks of them with the same batch. Call `resolve` or `unavailable_reason` first:
    this assumes the kernel is registered."""
    if a.dtype != jnp.float32 or b.dtype != jnp.float32 or a.ndim != b.ndim or a.ndim not in (2, 3):
        raise ValueError(f"matmul takes two 2-D or two 3-D float32 arrays, got {a.dtype}{list(a.shape)} and "
                         f"{b.dtype}{list(b.shape)}")
    if a.ndim == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes differ: {a.shape[0]} and {b.shape[0]}")
    inner_a = a.shape[-2] if transpose_a else a.shape[-1]
    inner_b = b.shape[-1] if transpose_b else b.shape[-2]
    if inner_a != inner_b:
        raise ValueError(f"contracted sizes differ: {inner_a} and {inner_b} (shapes {a.shape}, {b.shape}, "
                         f"transpose_a={transpose_a}, transpose_b={transpose_b})")
    return _ffi_matmul(a, b, transpose_a, transpose_b)


def _matmul_forward(a, b, transpose_a, transpose_b):
    return matmul(a, b, transpose_a, transpose_b), (a, b)


def _matmul_backward(transpose_a, transpose_b, residuals, cotangent):
    # With C = op(A) op(B) and G = dC: d op(A) = G op(B)^T and d op(B) = op(A)^T G, each written as one kernel call
    # on the stored buffers (transposing a product swaps its factors) instead of materialising a transpose.
    a, b = residuals
    if transpose_a:
        grad_a = _ffi_matmul(b, cotangent, transpose_b, True)
    else:
        grad_a = _ffi_matmul(cotangent, b, False, not transpose_b)
    if transpose_b:
        grad_b = _ffi_matmul(cotangent, a, True, transpose_a)
    else:
        grad_b = _ffi_matmul(a, cotangent, not transpose_a, False)
    return grad_a, grad_b


matmul.defvjp(_matmul_forward, _matmul_backward)


def dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]],
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
) -> jax.Array:
    """`jax.lax.dot_general`, with a float32 `[..., in]` x `[in, out]` (or `[out, in]`) product on the MKL kernel."""
    (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
    on_kernel = (
        lhs.dtype == jnp.float32
        and rhs.dtype == jnp.float32
        and preferred_element_type in (None, jnp.float32)
        and out_sharding is None
        and not lhs_batch
        and not rhs_batch
        and rhs.ndim == 2
        and tuple(lhs_contracting) == (lhs.ndim - 1,)
        and tuple(rhs_contracting) in ((0,), (1,))
    )
    if not on_kernel:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, out_sharding=out_sharding)
    rows = lhs.reshape(-1, lhs.shape[-1])
    product = matmul(rows, rhs, False, tuple(rhs_contracting) == (1,))
    return product.reshape(*lhs.shape[:-1], product.shape[-1])
