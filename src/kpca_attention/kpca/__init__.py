"""Kernel-PCA diagnostics of attention: the paper's checks (Teo & Nguyen 2024, Sec. 2) and the
critique's (Saritas & Yildiz 2025, arXiv 2505.07908), batched, float64, log space.

Library: :func:`feature_gram`, :func:`kpca_eigen`, :func:`predicted_values` (Theorem 1),
:func:`projection_loss` / :func:`projection_loss_official` (eq. 13, Fig. 1), :func:`gamma_test`
(Fig. 2, 5), :func:`top_eigenvalues` / :func:`eigen_stats`, :func:`alignment`, :func:`linear_cka`,
:func:`kernel_cka`; their chance levels and positive control: :func:`null_alignment`,
:func:`positive_control`, :func:`chance_test` (:mod:`.chance`). Capturing q, k, v from models lives
in :mod:`.capture`, the whole-model analysis in :mod:`.analysis` (an analysis file's per-record columns:
:func:`pack_records`, :func:`unpack_records`), the claims table in :mod:`.claims`, the training callback
in :mod:`.callback`.
"""

from .alignment import alignment, kernel_cka, linear_cka, optimal_cosine, rbf_gram, row_cosine
from .analysis import pack_records, unpack_records
from .chance import chance_test, null_alignment, positive_control, share_of_change
from .diagnostics import (
    eigen_stats,
    gamma_test,
    pairwise_difference_stats,
    projection_loss,
    projection_loss_official,
    standardize,
    top_eigenvalues,
)
from .gram import KPCAEigen, center_gram, feature_gram, kpca_eigen, log_g, predicted_values

__all__ = [
    "feature_gram",
    "center_gram",
    "log_g",
    "kpca_eigen",
    "KPCAEigen",
    "predicted_values",
    "projection_loss",
    "projection_loss_official",
    "standardize",
    "gamma_test",
    "pairwise_difference_stats",
    "top_eigenvalues",
    "eigen_stats",
    "alignment",
    "row_cosine",
    "optimal_cosine",
    "linear_cka",
    "kernel_cka",
    "rbf_gram",
    "null_alignment",
    "positive_control",
    "chance_test",
    "share_of_change",
    "pack_records",
    "unpack_records",
]
