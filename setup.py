"""Build of binlake's C extensions; everything else is in pyproject.toml.

``binlake.lake.decoding._imagec`` is the native image-JSON decoder that
``binlake.lake.decoding.decode`` uses when it imports; ``source.mysql._rowsc`` decodes
row-event bodies, ``source.mysql._framec`` frames the replication stream and
``source.mysql._snaprowc`` encodes the initial snapshot's rows for the
MySQL/MariaDB source; ``source.postgres._pgoutc`` decodes pgoutput
tuples for the PostgreSQL source. Each has an identical pure-Python path used
when it does not import, and a type stub (``.pyi``) next to its source; all
include the shared headers in ``include/binlake/_native``. ``pip install -e .``
(``make setup``) builds them in place next to their sources. They are
``optional``: a machine without a C compiler still installs binlake, and the
tests that check each was built (``tests/unit/test_native_build.py`` for every
extension listed here,
``tests/unit/test_lake_decode_native.py``, ``tests/source/test_native_rows_built.py``)
fail there, so CI notices a build that did not happen.
"""

from __future__ import annotations

from typing import Any

from setuptools import setup
from setuptools.extension import Extension as _Extension

# Every extension includes the headers in include/binlake/_native: binlake_native.h
# (the helpers they share) and binlake_tags.h (the binlog.proto tags they read and write).
NATIVE_INCLUDE = "include/binlake/_native"
NATIVE_HEADERS = [f"{NATIVE_INCLUDE}/binlake_native.h", f"{NATIVE_INCLUDE}/binlake_tags.h"]


def Extension(name: str, **kwargs: Any) -> _Extension:
    """setuptools' Extension with the shared headers on its include path and as its
    dependencies (a change to them rebuilds it; an sdist carries them). Named as the
    class so that the list below reads as a plain list of extensions."""
    return _Extension(name, include_dirs=[NATIVE_INCLUDE], depends=NATIVE_HEADERS, **kwargs)


setup(
    ext_modules=[
        Extension("binlake.lake.decoding._imagec", sources=["include/binlake/lake/decoding/_imagec.c"], optional=True),
        Extension("binlake.source.mysql._rowsc", sources=["include/binlake/source/mysql/_rowsc.c"], optional=True),
        Extension("binlake.source.mysql._framec", sources=["include/binlake/source/mysql/_framec.c"], optional=True),
        Extension("binlake.source.mysql._snaprowc", sources=["include/binlake/source/mysql/_snaprowc.c"],
                  optional=True),
        Extension("binlake.source.postgres._pgoutc", sources=["include/binlake/source/postgres/_pgoutc.c"],
                  optional=True),
    ],
)
