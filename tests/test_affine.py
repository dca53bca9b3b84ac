"""Index expressions: simplification keeps meaning; reshapes read the right elements."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from emmy.affine import Affine, Guard
from emmy.tensor_ir.builder import reshape_index


def _coords(extents):
    return np.indices(extents, sparse=True)


@st.composite
def affine_over(draw, extents):
    expr = Affine.constant(draw(st.integers(-5, 5)))
    for d in range(len(extents)):
        expr = expr + Affine.dim(d) * draw(st.integers(-4, 6))
    return expr


@settings(max_examples=200, deadline=None)
@given(data=st.data(), extents=st.lists(st.integers(1, 7), min_size=1, max_size=3), q=st.integers(1, 12))
def test_floordiv_and_mod_simplify_without_changing_values(data, extents, q):
    expr = data.draw(affine_over(extents))
    coords = _coords(extents)
    raw = np.broadcast_to(expr.evaluate(coords), extents)
    div = np.broadcast_to(expr.floordiv(q, extents).evaluate(coords), extents)
    mod = np.broadcast_to(expr.mod(q, extents).evaluate(coords), extents)
    assert (div == raw // q).all()
    assert (mod == raw % q).all()
    lo, hi = expr.bounds(extents)
    assert lo <= raw.min() and raw.max() <= hi


@settings(max_examples=200, deadline=None)
@given(data=st.data(), extents=st.lists(st.integers(1, 7), min_size=1, max_size=3), p=st.integers(2, 6),
       q=st.integers(1, 6), outer=st.sampled_from(["floordiv", "mod"]), inner=st.sampled_from(["floordiv", "mod"]))
def test_nested_floordiv_and_mod_keep_their_values(data, extents, p, q, outer, inner):
    # (e % (q*m)) // q, (e % (q*m)) % q and (e // p) // q: what composing two reshapes gives
    expr = data.draw(affine_over(extents))
    coords = _coords(extents)
    raw = np.broadcast_to(expr.evaluate(coords), extents)
    divisor = p * q if inner == "mod" else p
    nested = expr.floordiv(divisor, extents) if inner == "floordiv" else expr.mod(divisor, extents)
    first = raw // divisor if inner == "floordiv" else raw % divisor
    result = nested.floordiv(q, extents) if outer == "floordiv" else nested.mod(q, extents)
    expected = first // q if outer == "floordiv" else first % q
    assert (np.broadcast_to(result.evaluate(coords), extents) == expected).all()


def test_composed_reshapes_read_as_one_reshape():
    # merging the last two axes of a merge of the last two: (8, 64*128*32) read as plain digits
    d1 = Affine.dim(1)
    extents = (8, 262144)
    inner = d1.mod(4096, extents)  # the axis the first merge made, split back
    assert inner.floordiv(32, extents) == d1.floordiv(32, extents).mod(128, extents)
    assert inner.mod(32, extents) == d1.mod(32, extents)
    assert d1.floordiv(32, extents).floordiv(128, extents) == d1.floordiv(4096, extents)


@st.composite
def _factorisations(draw, n):
    """A random shape with n elements: n's prime factors, shuffled and grouped, with some 1s."""
    primes, k, p = [], n, 2
    while k > 1:
        while k % p == 0:
            primes.append(p)
            k //= p
        p += 1
    primes = draw(st.permutations(primes))
    shape, current = [], 1
    for prime in primes:
        if current > 1 and draw(st.booleans()):
            shape.append(current)
            current = 1
        current *= prime
        if draw(st.integers(0, 5)) == 0:
            shape.append(1)
    shape.append(current)
    return shape


@settings(max_examples=200, deadline=None)
@given(src=st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4), data=st.data())
def test_reshape_index_reads_row_major(src, data):
    total = int(np.prod(src))
    dst = data.draw(_factorisations(total))
    x = np.arange(total).reshape(src)
    index = reshape_index(src, dst)
    coords = _coords(dst)
    gathered = x[tuple(np.broadcast_to(np.asarray(e.evaluate(coords)), dst) for e in index)]
    assert (gathered == x.reshape(dst)).all()


def test_printing_is_readable():
    d0, d1 = Affine.dim(0), Affine.dim(1)
    assert str(d1 * 3 + d0 - 2) == "d0 + 3*d1 - 2"
    assert str(d1 - d0) == "d1 - d0"
    assert str((d0 * 4 + d1).floordiv(3, [5, 4])) == "(4*d0 + d1) // 3"
    assert str(Guard(d1 - d0, hi=1)) == "d1 - d0 < 1"
    assert str(Guard(d0, lo=2, hi=5)) == "2 <= d0 < 5"


def test_gcd_rule_finds_the_plain_quotient():
    # (4*d0 + d1) // 12 with d1 < 4 is d0 // 3.
    expr = Affine.dim(0) * 4 + Affine.dim(1)
    assert str(expr.floordiv(12, [6, 4])) == "d0 // 3"
    assert str(expr.mod(12, [6, 4])) == "d1 + 4*(d0 % 3)"


def test_equal_maps_are_equal_values():
    a = Affine.dim(0) * 2 + Affine.dim(1)
    b = Affine.dim(1) + Affine.dim(0) + Affine.dim(0)
    assert a == b and hash(a) == hash(b)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), extents=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       new_extents=st.lists(st.integers(1, 6), min_size=1, max_size=3), q=st.integers(2, 5))
def test_substituting_coordinates_keeps_values(data, extents, new_extents, q):
    """expr(mapping(c)) == expr.substitute(mapping)(c): quotients, remainders and repeated
    coordinates included (the lowering renames every index through it)."""
    expr = data.draw(affine_over(extents))
    expr = expr + expr.floordiv(q, extents) * data.draw(st.integers(-3, 3)) + expr.mod(q, extents)
    mapping = [data.draw(affine_over(new_extents)).mod(extents[d], new_extents) if data.draw(st.booleans())
               else Affine.dim(data.draw(st.integers(0, len(new_extents) - 1))).mod(extents[d], new_extents)
               for d in range(len(extents))]
    coords = _coords(new_extents)
    mapped = [np.broadcast_to(m.evaluate(coords), new_extents) for m in mapping]
    want = np.broadcast_to(expr.evaluate(mapped), new_extents)
    got = np.broadcast_to(expr.substitute(mapping, new_extents).evaluate(coords), new_extents)
    assert (got == want).all()


def _shared_chain(levels: int) -> Affine:
    """An expression whose every level reads the one below twice (a floor division and a remainder
    of one flattened index, as reshapes make them): 2**levels paths, `levels` objects."""
    from emmy.affine import FloorDiv, Mod

    e = Affine.dim(0)
    for _ in range(levels):
        e = Affine(((FloorDiv(e, 3), 1), (Mod(e, 5), 2)), 1)
    return e


def test_an_expression_sharing_its_parts_hashes_and_measures_its_depth_once_per_part():
    import pickle

    deep = _shared_chain(60)  # hashed through every path, this would never finish
    assert hash(deep) == hash(_shared_chain(60))
    assert deep.division_depth() == 60
    small = _shared_chain(8)
    again = pickle.loads(pickle.dumps(small))  # the cached hash stays out of the pickle
    hash(small)
    assert "_hash" in small.__dict__  # made once, kept on the object
    assert "_hash" not in again.__dict__ and again == small and hash(again) == hash(small)


def test_layouts_compose_only_while_their_divisions_nest_shallow():
    from emmy.egraph.layout import MAX_DIVISION_NESTING, Layout, compose, decode_layout, encode_layout

    def wrapped(levels: int) -> str:  # ((d0 + 1) % 5 + 1) % 5 ... on 7 positions: no level simplifies
        e = Affine.dim(0)
        for _ in range(levels):
            e = (e + 1).mod(5, (7,))
        assert e.division_depth() == levels
        return encode_layout(Layout((7,), (e,), (), None))

    half = MAX_DIVISION_NESTING // 2
    assert decode_layout(compose(wrapped(half), wrapped(half))).index[0].division_depth() == 2 * half
    assert compose(wrapped(half), wrapped(half + 1)) == ""


@settings(max_examples=200, deadline=None)
@given(data=st.data(), extents=st.lists(st.integers(1, 7), min_size=1, max_size=3), q=st.integers(2, 9),
       c=st.integers(-3, 3).filter(bool))
def test_a_split_index_put_back_together_is_the_index(data, extents, q, c):
    """c*(e % q) + c*q*(e // q) == c*e for every integer e: a view that splits an axis read through
    one that merges it indexes by e itself, not by two atoms that each spell e."""
    e = data.draw(affine_over(extents)) + Affine.dim(0).mod(3, extents) * 2  # e keeps a remainder of its own
    together = e.mod(q, extents) * c + e.floordiv(q, extents) * (c * q) + 5
    coords = _coords(extents)
    assert (np.broadcast_to(together.evaluate(coords), extents) ==
            np.broadcast_to((e * c + 5).evaluate(coords), extents)).all()
    assert together.division_depth() <= e.division_depth()  # no level around e


def test_a_chain_of_relative_shifts_stays_one_level_deep():
    """Transformer-XL's relative shift (reshape to (k, q), drop a row, reshape to (q, k - 1)) read
    through itself: each level's merge undoes the split below it, so the index does not nest."""
    extents = [5, 12]  # (query, key) coordinates of the last level's output
    q_axis, k_axis = Affine.dim(0), Affine.dim(1)
    keys = 12 + 6
    for level in range(6):  # output (q, k-1) of an input (q, k): flat q*(k-1) + j, read as (k, q) from row 1
        flat = q_axis * (keys - 1) + k_axis + 5
        q_axis, k_axis = flat.floordiv(keys, extents + [keys]), flat.mod(keys, extents + [keys])
        flat = q_axis * keys + k_axis  # back to the input's own (q, k) through the row-major merge
        q_axis, k_axis = flat.floordiv(keys, extents + [keys]), flat.mod(keys, extents + [keys])
        keys += 1
    assert max(q_axis.division_depth(), k_axis.division_depth()) <= 1


@settings(max_examples=300, deadline=None)
@given(a=st.integers(-9, 9), b=st.integers(-20, 20), q=st.integers(1, 9), lo=st.integers(-40, 40),
       width=st.integers(0, 60))
def test_digit_pairs_are_bounded_exactly(a, b, q, lo, width):
    from emmy.affine import digits_range

    values = [a * (e % q) + b * (e // q) for e in range(lo, lo + width + 1)]
    assert digits_range(a, b, q, lo, lo + width) == (min(values), max(values))


def test_a_relative_shift_index_is_bounded_as_a_pair():
    # e % 7 + 6*(e // 7) - 1 over e in 1..34 reaches 0..28: the remainder and the quotient bounded
    # apart would say -1..33
    e = Affine.dim(0) * 6 + Affine.dim(1) + 1  # d0 in 0..4, d1 in 0..9
    extents = (5, 10)
    index = e.mod(7, extents) + e.floordiv(7, extents) * 6 - 1
    coords = _coords(extents)
    values = np.broadcast_to(index.evaluate(coords), extents)
    assert index.bounds(extents) == (int(values.min()), int(values.max()))
