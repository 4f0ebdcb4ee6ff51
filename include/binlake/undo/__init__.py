"""``binlake undo``: put back the rows a bad change touched, from the lake's images.

``selection`` says which change rows are undone (a commit_ts range or exact
transactions, narrowed by tables and a Spark SQL predicate) and checks it;
``fold`` computes in Spark, per touched key, the image before the first chosen
change and after the last one (the lake's own typed fold, on today's table
definition); ``revert`` compares the target's rows with the after images and
puts the before images back in one target transaction, recorded in
``_binlake_undo`` (``record``) so a rerun is a no-op; ``commands`` is the CLI.
"""
