"""kpca-attention: the kernel-PCA view of self-attention.

RPC-Attention (Teo & Nguyen, NeurIPS 2024) as drop-in timm layers, the paper's models, robustness
evaluation, and the KPCA diagnostics of both the paper and its critique (arXiv 2505.07908).
"""

from . import models  # noqa: F401  (registers the paper's vision models in timm)
from .attention import RPCAttention, ScaledAttention, SymmetricAttention, configure, replace_attention
from .pap import pap, pap_mu, shrink
from .robust_pca import RobustPCAResult, robust_pca, svt

__version__ = "0.1.0"

__all__ = [
    "pap",
    "pap_mu",
    "shrink",
    "SymmetricAttention",
    "RPCAttention",
    "ScaledAttention",
    "configure",
    "replace_attention",
    "robust_pca",
    "RobustPCAResult",
    "svt",
    "models",
]
