"""The sources' native decoders (MySQL rows, stream framing and snapshot rows, PostgreSQL
pgoutput tuples) are built where binlake is installed with a C compiler
(``make setup``): a machine where they silently were not would run every
change through the slower Python path."""

from __future__ import annotations

from binlake.source.mysql import rowsplan


def test_native_row_decoder_is_built() -> None:
    assert rowsplan.available(), (
        f"binlake.source.mysql._rowsc did not import ({rowsplan.import_error()}); run `make setup` "
        "(pip install -e . builds it) on a machine with a C compiler"
    )


def test_native_framer_is_built() -> None:
    from binlake.source.mysql import framing

    assert framing.available(), (
        f"binlake.source.mysql._framec did not import ({framing.import_error()}); run `make setup` "
        "(pip install -e . builds it) on a machine with a C compiler"
    )


def test_native_pgoutput_decoder_is_built() -> None:
    from binlake.source.postgres import pgplan

    assert pgplan.available(), (
        f"binlake.source.postgres._pgoutc did not import ({pgplan.import_error()}); run `make setup` "
        "(pip install -e . builds it) on a machine with a C compiler"
    )


def test_native_snapshot_row_encoder_is_built() -> None:
    from binlake.source.mysql import snapshot

    assert snapshot.native_available(), (
        f"binlake.source.mysql._snaprowc did not import ({snapshot.native_import_error()}); run `make setup` "
        "(pip install -e . builds it) on a machine with a C compiler"
    )
