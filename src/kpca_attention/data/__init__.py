"""Datasets: images in [0, 1] (normalisation inside the model) and text corpora with vocabularies."""

from .images import DATASETS, ImageDatasetInfo, build_image_dataset, dataset_info

__all__ = ["DATASETS", "ImageDatasetInfo", "build_image_dataset", "dataset_info"]
