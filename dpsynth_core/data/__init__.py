"""Data loading and validation: the user's private files and the public benchmark sets.

Errors are :class:`dpsynth_core.errors.DataError` naming the file, column and 1-based data row,
never the private value.
"""

from dpsynth_core.data.loaders import DEFAULT_MAX_CHARS, TextDataset, load_records, load_text_dataset
from dpsynth_core.data.public import (
    ADULT_COLUMNS,
    ADULT_NUMERIC,
    BIORXIV_ATTRIBUTES,
    data_dir,
    load_adult,
    load_biorxiv,
)
from dpsynth_core.data.readers import SUPPORTED_SUFFIXES
from dpsynth_core.errors import DataError

__all__ = [
    "ADULT_COLUMNS",
    "ADULT_NUMERIC",
    "BIORXIV_ATTRIBUTES",
    "DEFAULT_MAX_CHARS",
    "DataError",
    "SUPPORTED_SUFFIXES",
    "TextDataset",
    "data_dir",
    "load_adult",
    "load_biorxiv",
    "load_records",
    "load_text_dataset",
]
