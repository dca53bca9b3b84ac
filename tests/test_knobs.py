"""The knob codec: one spelling per value, errors that name the knob and its legal forms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import emmy
from emmy.errors import EmmyError
from emmy.extract.targets import get_target
from emmy.schedule.knobs import KNOB_NAMES, MMA_ATOMS, Schedule, check_target, parse_pins, parse_value
from tests.conftest import run_emmy

PINNED = "WORK=w1x2,TILE=mma_m16n8k16_f16_f32/f1x1/k8,REDUCE=,STAGE=d3/smem-tma,RASTER="
MATMUL = ("torch.matmul(torch.randn(128,128,dtype=torch.float16), torch.randn(128,128,dtype=torch.float16))")

n = st.integers(1, 64)
rows = st.fixed_dictionaries({
    "WORK": st.one_of(st.integers(1, 32).map(lambda k: f"t{32 * k}"),
                      st.tuples(st.integers(1, 4), st.integers(1, 8)).map(lambda t: f"w{t[0]}x{t[1]}")),
    "TILE": st.one_of(st.tuples(st.integers(1, 8), st.sampled_from([2, 4, 8])).map(lambda t: f"f{t[0] * t[1]}/v{t[1]}"),
                      n.map(lambda k: f"f{k}"),
                      st.tuples(st.sampled_from(MMA_ATOMS), n, n, n).map(lambda t: f"{t[0]}/f{t[1]}x{t[2]}/k{t[3]}")),
    "REDUCE": st.one_of(st.just(""), st.just("coop"),
                        st.tuples(st.integers(2, 64), st.sampled_from("ak")).map(lambda t: f"g{t[0]}{t[1]}")),
    "STAGE": st.one_of(st.just(""), st.tuples(st.integers(1, 4), st.sampled_from(["smem", "smem-async", "smem-tma"]))
                       .map(lambda t: f"d{t[0]}/{t[1]}")),
    "RASTER": st.one_of(st.just(""), n.map(lambda k: f"gm{k}")),
})


@given(rows)
def test_every_legal_row_prints_as_it_parses(values):
    text = ",".join(f"{k}={values[k]}" for k in KNOB_NAMES)  # printing order is canonical too
    row = parse_pins(text)
    assert str(row) == text
    assert parse_pins(str(row)) == row


@pytest.mark.parametrize("knob,value,needle", [
    ("WORK", "t100", "whole warps of 32"),
    ("WORK", "t2048", "exceed CUDA's 1024"),
    ("WORK", "w8x8", "exceed CUDA's 1024"),
    ("WORK", "T256", "t<N> or w<M>x<N>"),
    ("WORK", "t0256", "t<N> or w<M>x<N>"),
    ("TILE", "mma_m16n8k16_f16/f1x1/k8", "mma_m16n8k16_f16_f32 | mma_m16n8k16_bf16_f32"),
    ("TILE", "f6/v4", "multiple of the vector width"),
    ("TILE", "f8/v3", "vector width must be one of"),
    ("REDUCE", "cooperative", "coop, g<N>a, g<N>k or g<N>s"),
    ("REDUCE", "g1a", "at least 2 blocks"),
    ("STAGE", "d3/tma", "d<D>/smem-tma"),
    ("RASTER", "g4", "gm<G>"),
])
def test_misspelt_values_name_the_knob_and_the_legal_forms(knob, value, needle):
    with pytest.raises(EmmyError) as err:
        parse_value(knob, value)
    assert err.value.message.startswith(f"{knob}={value!r} is not a legal {knob} value")
    assert needle in err.value.message


def test_pin_syntax_errors():
    with pytest.raises(EmmyError, match="unknown knob 'WARP'; knobs are WORK, TILE, REDUCE, STAGE, RASTER"):
        parse_pins("WARP=t256")
    with pytest.raises(EmmyError, match="has no '='"):
        parse_pins("WORK")
    with pytest.raises(EmmyError, match="pinned twice"):
        parse_pins("WORK=t256,WORK=t128")
    assert parse_pins("") == Schedule()
    assert parse_pins("STAGE=d2/smem").pinned() == {"STAGE": "d2/smem"}


def test_target_features_forbid_pins_with_the_rule_that_says_why():
    row = parse_pins(PINNED)
    check_target(row, get_target("sm_90"))
    check_target(row, get_target("sm_120"))
    with pytest.raises(EmmyError, match=r"^STAGE=d3/smem-tma needs sm_90 or newer; target is sm_80$"):
        check_target(row, get_target("sm_80"))
    check_target(parse_pins("STAGE=d2/smem-async"), get_target("sm_80"))


def test_cli_checks_pins_before_compiling():
    bad_target = run_emmy("compile", "-c", MATMUL, "--target", "sm_80", "--ir", "tile", env={"EMMY_KNOBS": PINNED})
    assert bad_target.returncode == 2
    assert bad_target.stderr.splitlines()[0] == "emmy: error: STAGE=d3/smem-tma needs sm_90 or newer; target is sm_80"
    misspelt = run_emmy("compile", "-c", MATMUL, "--knobs", "TILE=mma_m16n8k16/f1x1/k8")
    assert misspelt.returncode == 2
    assert "TILE='mma_m16n8k16/f1x1/k8' is not a legal TILE value" in misspelt.stderr


SOFTMAX_FEW_LONG_ROWS = "x = torch.randn(3, 20000); torch.softmax(x, -1)"


@pytest.mark.parametrize("knobs,reason", [
    # each value legal, together a thread would hold 4 steps x 16 bytes x 4 = 256 bytes of the row
    ("REDUCE=g5s,WORK=t64,TILE=f4/v4,STAGE=regs",
     "STAGE=regs keeps a thread's share of the row in registers, at most 128 bytes; WORK=t64, TILE=f4/v4 and "
     "REDUCE=g5s give each thread 256 bytes of the 20000-element row"),
    # 40 blocks x 128 threads x 4 elements reach past the row
    ("REDUCE=g40s,WORK=t128,TILE=f4/v4",
     "REDUCE=g40s splits each row among 40 blocks, each taking at least a pass of its 128 threads x 4 elements: "
     "20480 elements, more than the row's 20000"),
])
def test_pins_legal_alone_but_not_together_say_which_limit_they_pass(knobs, reason):
    with pytest.raises(EmmyError) as caught:
        emmy.optimize(SOFTMAX_FEW_LONG_ROWS, knobs=knobs).tile_ir
    message = str(caught.value)
    assert reason in message
    assert "is not legal for this kernel" not in message  # g5s and g40s are legal, pinned alone
    emmy.optimize(SOFTMAX_FEW_LONG_ROWS, knobs=knobs.split(",")[0]).tile_ir  # it is: a row is found
