"""The robust-attention family's timm names, one module per mechanism (``<m>.py``: its ``@register_model``
functions, one per name, and its ``default_cfgs``). Importing this package registers them; the table of
mechanisms and forms and the builders they call are :mod:`kpca_attention.models.family`'s.

Adding a mechanism's models: a row in ``family.FAMILY_MECHANISMS``, then a module here like its siblings
(``tests/test_family_models.py`` checks that each mechanism's module registers exactly its names).
"""

from . import elliptical, kde, neutreno, pid, rkde, rvt, twicing  # noqa: F401  (registers the models)

__all__ = ["neutreno", "pid", "elliptical", "twicing", "kde", "rkde", "rvt"]
