"""``python -m kpca_attention.cli`` (what ``torchrun ... -m kpca_attention.cli train`` runs)."""

from . import main

main()
