"""Build of binlake's one C extension; everything else is in pyproject.toml.

``binlake.lake._imagec`` is the native image-JSON decoder that
``binlake.lake.decode`` uses when it imports (it falls back to the identical
pure-Python path when it does not). ``pip install -e .`` (``make setup``) builds
it in place next to its source. It is ``optional``: a machine without a C
compiler still installs binlake, and ``tests/unit/test_lake_decode_native.py``
fails there, so CI notices a build that did not happen.
"""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("binlake.lake._imagec", sources=["include/binlake/lake/_imagec.c"], optional=True),
        Extension("binlake.source.mysql._rowsc", sources=["include/binlake/source/mysql/_rowsc.c"], optional=True),
    ],
)
