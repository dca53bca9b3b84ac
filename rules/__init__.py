"""emmy.rules: the e-graph rulesets (installed as emmy.rules)."""
