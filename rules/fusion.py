"""Fusion: a value computed by a kernel of its own equals its computation
inlined into the consumer. Both forms stay; extraction decides where kernel
boundaries go (recomputation and memory traffic are in its cost)."""

from __future__ import annotations

from egglog import String, i64, rewrite, vars_

from emmy.egraph.terms import Term
from emmy.rules import RuleGroup

x, y, z = vars_("x y z", Term)
op, d, layout = vars_("op d layout", String)
(axis,) = vars_("axis", i64)

fusion = RuleGroup("fusion", "fusion", "kernel boundaries become optional: producers may fuse into consumers")
fusion.rule("inline_elementwise", "mat(elementwise) = elementwise: chains fuse into one body",
            rewrite(Term.mat(Term.unary(op, d, x))).to(Term.unary(op, d, x)),
            rewrite(Term.mat(Term.binary(op, d, x, y))).to(Term.binary(op, d, x, y)),
            rewrite(Term.mat(Term.select(d, x, y, z))).to(Term.select(d, x, y, z)))
fusion.rule("inline_reduction", "mat(reduce) = reduce: a reduction fuses into its consumer",
            rewrite(Term.mat(Term.reduce(op, axis, x))).to(Term.reduce(op, axis, x)))
fusion.rule("inline_layout", "mat(reindex) = reindex: layout maps fold into loads",
            rewrite(Term.mat(Term.reindex(x, layout))).to(Term.reindex(x, layout)))

RULESETS = [fusion]
