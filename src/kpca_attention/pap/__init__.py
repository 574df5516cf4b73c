"""Principal Attention Pursuit (PAP), Algorithm 1 of Teo & Nguyen (NeurIPS 2024): the package.

The entry module :mod:`.algorithm` holds :func:`pap` (one dispatcher choosing the path) and the reference
loop; beneath it :mod:`.softmax` (the cutoff softmax), :mod:`.updates` and :mod:`.fused` (the fused CPU
paths), :mod:`.variants` (ablations, the compiled loop), :mod:`.trace` (diagnostics from PAP's states)
and, lowest, :mod:`.inputs` (checks, masks, predicates). docs/pap.md describes the algorithm and paths.
"""

from ..robust_pca import shrink
from .algorithm import pap, pap_mu, pap_tau
from .inputs import RPC_OFFICIAL, THRESHOLDS, Threshold, check_options, checks_values, tracing, visible
from .softmax import cutoff_attention, softmax_cutoff
from .trace import STATES, TRACE_KEYS, PAPTrace, key_validity

__all__ = [
    "pap", "pap_mu", "pap_tau", "shrink", "RPC_OFFICIAL", "THRESHOLDS", "Threshold", "check_options",
    "visible", "tracing", "checks_values", "cutoff_attention", "softmax_cutoff", "TRACE_KEYS", "STATES",
    "PAPTrace", "key_validity",
]
