"""Build of binlake's C extensions; everything else is in pyproject.toml.

``binlake.lake.decoding._imagec`` is the native image-JSON decoder that
``binlake.lake.decoding.decode`` uses when it imports; ``source.mysql._rowsc`` decodes
row-event bodies and ``source.mysql._framec`` frames the replication stream
for the MySQL/MariaDB source. Each has an identical pure-Python path used when
it does not import. ``pip install -e .`` (``make setup``) builds them in place
next to their sources. They are ``optional``: a machine without a C compiler
still installs binlake, and the tests that check each was built
(``tests/unit/test_lake_decode_native.py``, ``tests/source/test_native_rows_built.py``)
fail there, so CI notices a build that did not happen.
"""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("binlake.lake.decoding._imagec", sources=["include/binlake/lake/decoding/_imagec.c"], optional=True),
        Extension("binlake.source.mysql._rowsc", sources=["include/binlake/source/mysql/_rowsc.c"], optional=True),
        Extension("binlake.source.mysql._framec", sources=["include/binlake/source/mysql/_framec.c"], optional=True),
        Extension("binlake.source.postgres._pgoutc", sources=["include/binlake/source/postgres/_pgoutc.c"],
                  optional=True),
    ],
)
