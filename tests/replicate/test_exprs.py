"""Expression filters' typed view of an image (``replicate.exprs``) on the widest
decimals MySQL allows: a ``DECIMAL(65,30)`` column is read as its exact text
(Spark's decimals stop at 38 digits), so a predicate over it runs and selects
exactly the rows it names."""

from __future__ import annotations

import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from binlake.replicate import exprs
from binlake.sql import schema as sc

WIDE = "12345678901234567890123456789012345.123456789012345678901234567890"


def test_a_decimal_wider_than_spark_reads_as_its_exact_text(spark: SparkSession) -> None:
    info = sc.new_table(11, "app", "ledger", [sc.ColumnDef("id", "int", False),
                                              sc.ColumnDef("amount", "decimal", precision=65, scale=30),
                                              sc.ColumnDef("fee", "decimal", precision=12, scale=2)], ["id"], None, 1)
    by_name = {c.name: exprs.spark_type(c) for c in info.columns}
    assert by_name == {"id": "bigint", "amount": "string", "fee": "decimal(12,2)"}
    images = [json.dumps({"id": 1, "amount": WIDE, "fee": "1.50"}), json.dumps({"id": 2, "amount": "7", "fee": "2"})]
    df = spark.createDataFrame([(i,) for i in images], "after string")
    typed = df.select(F.from_json("after", exprs.spark_schema(info)).alias("a")).select("a.*")
    hits = typed.where(f"amount = '{WIDE}'").select("id", "fee").collect()
    assert [(r["id"], str(r["fee"])) for r in hits] == [(1, "1.50")]
    assert [r["id"] for r in typed.where("fee > 1.75").collect()] == [2]
