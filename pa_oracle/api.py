"""The one module a kernel or adapter author imports (``docs/adapters.md``): the names below are the
suite's public surface for them, re-exported from the rooms that own them.

- your own attention function: ``declare`` (narrow its draws), ``UserKernel`` (wrap it by hand);
- an attention adapter: ``Backend`` with ``@register``, ``Capabilities``, ``Contract`` and its
  ``Precondition``s, ``KernelOutput``, ``Unsupported`` (a skip) and ``ContractViolation`` (a failure),
  ``Part`` (a composed kernel's parts), ``GraphCall`` and ``capture_cuda_graph`` (the CUDA-graph check);
- the case and its tensors: ``Case`` (``Layout``, ``Heads``, ``Options``, ``Rope``, ``CustomMask``,
  ``Storage``), ``CaseError``, ``Tensors``, ``make_tensors``, ``load_case``;
- the oracle: ``reference`` (float64 ``Reference``), ``plain_controls``, ``compare`` with a
  ``Tolerance``, giving a ``Verdict``;
- a KV-cache write kernel: ``WriteKernel`` with ``@register_write``, ``WriteCapabilities``,
  ``declare_write``, ``AppendCase``, ``AppendInputs``.

Importing it loads torch and the oracle, never the fuzzing machinery (Hypothesis, the campaign).
"""

from __future__ import annotations

from pa_oracle.backends.base import (
    Backend,
    Capabilities,
    Contract,
    ContractViolation,
    GraphCall,
    KernelOutput,
    Part,
    Precondition,
    Unsupported,
    capture_cuda_graph,
    register,
)
from pa_oracle.backends.user import UserKernel, declare
from pa_oracle.backends.writes import register as register_write
from pa_oracle.backends.writes.base import WriteCapabilities, WriteKernel
from pa_oracle.backends.writes.user import declare_write
from pa_oracle.oracle.append import AppendCase, AppendInputs
from pa_oracle.oracle.case import Case, CaseError, CustomMask, Heads, Layout, Options, Rope, Storage
from pa_oracle.oracle.reference import plain_controls, reference
from pa_oracle.oracle.result import Reference
from pa_oracle.oracle.tensors import Tensors, load_case, make_tensors
from pa_oracle.oracle.tolerance import Tolerance, Verdict, compare

__all__ = [
    # your own attention function
    "declare", "UserKernel",
    # an attention adapter
    "Backend", "register", "Capabilities", "Contract", "Precondition", "KernelOutput", "Unsupported",
    "ContractViolation", "Part", "GraphCall", "capture_cuda_graph",
    # the case and its tensors
    "Case", "Layout", "Heads", "Options", "Rope", "CustomMask", "Storage", "CaseError", "Tensors", "make_tensors",
    "load_case",
    # the oracle
    "reference", "Reference", "plain_controls", "compare", "Tolerance", "Verdict",
    # a KV-cache write kernel
    "WriteKernel", "register_write", "WriteCapabilities", "declare_write", "AppendCase", "AppendInputs",
]
