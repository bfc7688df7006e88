"""charlm: train small language models on a text file and watch how they remember."""

__version__ = "0.1.0"
