__version__ = "2.10.0+standin"
