"""Lamplight's Qt-free core: engine, templates, metrics, settings and storage."""

__version__ = "0.1.0"
