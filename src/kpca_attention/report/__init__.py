"""Reports written from result files: the one study report (:mod:`.study`, the sections of each task come
from :mod:`kpca_attention.tasks`), paired statistics and verdicts (:mod:`.stats`), the KPCA and PAP-trace
reports. Markdown tables and number formats are the core's :mod:`kpca_attention.tables`."""
