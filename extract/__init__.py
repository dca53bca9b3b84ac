"""emmy.extract: the target table, cost models and extraction (installed as emmy.extract)."""
