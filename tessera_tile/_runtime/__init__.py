"""What every call shares at run time: the environment read once (``config``), arguments read
once into records and device memory (``arrays``), persistent cache files (``cache``), and
everything CuPy-specific (``cupy``, imported only when CuPy is used)."""
