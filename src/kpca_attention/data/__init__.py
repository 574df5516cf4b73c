"""Datasets: images in [0, 1] (normalisation inside the model) and text corpora with vocabularies."""

from .images import DATASETS, ImageDatasetInfo, build_image_dataset, dataset_info
from .text import CORPORA, TextCorpus, Vocab, load_corpus

__all__ = ["DATASETS", "ImageDatasetInfo", "build_image_dataset", "dataset_info",
           "CORPORA", "TextCorpus", "Vocab", "load_corpus"]
