__version__ = "0.62.1"
