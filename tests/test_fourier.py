"""Fourier transforms of complex pairs (emmy.decompose.fourier) and the complex ops around them:
each program runs in the simulator (ASan) against torch's float64 run."""

import pytest
import torch

import emmy
from emmy.errors import UnsupportedOpError
from emmy.runtime import check_program
from tests.conftest import Calls


class SpectralConv(torch.nn.Module):
    """A Fourier neural operator's layer: the lowest modes of the input's spectrum mixed by complex
    weights (a complex parameter, a complex einsum, a write into complex zeros), then back to real."""

    def __init__(self, channels=3, modes=3):
        super().__init__()
        self.modes = modes
        self.weights = torch.nn.Parameter(torch.randn(channels, channels, modes, modes, dtype=torch.cfloat) * 0.1)

    def forward(self, x):
        b, c, h, w = x.shape
        spectrum = torch.fft.rfft2(x)
        mixed = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat)
        m = self.modes
        mixed[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", spectrum[:, :, :m, :m], self.weights)
        return torch.fft.irfft2(mixed, s=(h, w))


torch.manual_seed(0)  # the inputs below: the same in every worker, whatever ran before
PROGRAMS = {
    "fnet_mixing": (lambda h: torch.fft.fftn(h, dim=(1, 2)).real, (torch.randn(2, 8, 6),)),
    "rfft_irfft_odd_and_even": (lambda x: (torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]),
                                           torch.fft.irfft(torch.fft.rfft(x[:, :9]), n=9)), (torch.randn(3, 10),)),
    "norms": (lambda x: (torch.fft.rfft(x, norm="ortho").abs(), torch.fft.fftn(x, norm="forward").abs(),
                         torch.fft.ifft(torch.fft.fft(x, norm="backward")).imag), (torch.randn(4, 12),)),
    # the mean's bin of a real signal has an imaginary part of +0: its angle is pi where the mean is negative
    "angle_of_real_bins": (lambda x: torch.fft.rfft(x - 1.0, dim=0).angle(), (torch.randn(6, 5),)),
    "complex_products_and_sums": (lambda x: torch.view_as_real(torch.fft.fft(x) * torch.fft.fft(x).sum(-1, keepdim=True)),
                                  (torch.randn(5, 7),)),
    "cast_to_real": (lambda x: torch.fft.fft(x).to(torch.float32) * 2, (torch.randn(3, 8),)),  # the real part
    "power_spectrogram": (lambda x: torch.stft(x, 16, hop_length=4, window=torch.hann_window(16),
                                               return_complex=True).abs().pow(2), (torch.randn(2, 64),)),
    "spectral_conv": (SpectralConv(), (torch.randn(2, 3, 8, 8),)),
    "shift_conjugate_frequencies": (lambda x: (torch.fft.fftshift(torch.fft.fft2(x)).abs(),
                                               torch.fft.hfft(torch.fft.rfft(x[0])),  # hfft conjugates
                                               x[0, :, :5] * torch.fft.rfftfreq(8)), (torch.randn(2, 6, 8),)),
    "padded_and_ihfft": (lambda x: (torch.fft.fft2(x, s=(8, 10)), torch.fft.ihfft2(x)),  # complex pads, _conj_physical
                         (torch.randn(2, 6, 8),)),
    "fft_convolution_and_istft": (lambda x, k: (torch.fft.irfft(torch.fft.rfft(x, n=32) * torch.fft.rfft(k, n=32), n=32),
                                                torch.istft(torch.stft(x, 8, 2, window=torch.hann_window(8),
                                                                       return_complex=True), 8, 2,
                                                            window=torch.hann_window(8), length=16)),
                                  (torch.randn(4, 16), torch.randn(4, 16))),
    # a complex64 input, taken as its pairs (the caller's tensor viewed as real)
    "complex_input": (lambda z, x: (torch.view_as_real(torch.fft.ifft(z * torch.fft.fft(x))), (z * z).abs()),
                      (torch.randn(3, 8, dtype=torch.cfloat), torch.randn(3, 8))),
}


@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # eager's own, in cast_to_real
@pytest.mark.parametrize("name", PROGRAMS)
def test_fourier_programs_run_right_in_the_simulator(name):
    fn, inputs = PROGRAMS[name]
    module = fn if isinstance(fn, torch.nn.Module) else Calls(fn)
    torch.manual_seed(0)
    program = emmy.optimize(module, *inputs)
    checks = check_program(program, mode="asan")
    assert checks and all(c.ok for c in checks), checks


def test_bins_on_quarter_turns_are_exact_so_their_angles_do_not_flip():
    """The mean's and the Nyquist bin's imaginary parts are 0 exactly (sin(pi) in floating point is
    1.2e-16, whose rounding of either sign turned a negative bin's angle from pi to -pi)."""
    fn = Calls(lambda x: torch.fft.rfft(x - 1.0, dim=0).angle())
    for seed in (0, 10):  # 10: a Nyquist bin whose rounded sines gave -pi
        torch.manual_seed(seed)
        x = torch.randn(6, 5)
        torch.testing.assert_close(emmy.optimize(fn, x)(x), fn(x))


def test_a_complex_input_is_taken_on_every_route():
    fn, (z, x) = PROGRAMS["complex_input"]
    program = emmy.optimize(Calls(fn), z, x)
    for got in (program(z, x, sim_mode="asan"), program(z, x, device="interpret")):
        for have, want in zip(got, fn(z, x)):
            torch.testing.assert_close(have, want)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")  # torch's own, making complex32
def test_complex128_is_pairs_of_f64_to_f64_precision():
    """A float64 program's spectrum: complex128 inputs, outputs and Python complex scalars (a spectral
    derivative, 1j * k * u_hat), checked at f64's tolerance; complex32 is refused by name."""
    u = torch.sin(torch.linspace(0, 2 * torch.pi, 17, dtype=torch.float64)[:16]).repeat(2, 1)
    k = torch.fft.rfftfreq(16, 1 / 16).to(torch.float64) * 2 * torch.pi
    derivative = emmy.optimize(Calls(lambda u: torch.fft.irfft(1j * k * torch.fft.rfft(u), n=16)), u)
    spectrum = emmy.optimize(Calls(lambda z: (torch.fft.fft(z), (z * z).abs())), torch.randn(3, 8, dtype=torch.complex128))
    for program in (derivative, spectrum):
        checks = check_program(program, mode="asan")
        assert checks and all(c.ok for c in checks), checks
    assert spectrum(*spectrum.example_inputs)[0].dtype == torch.complex128
    with pytest.raises(emmy.EmmyError, match="unsupported dtype complex32 .*emmy takes complex64 and complex128"):
        emmy.optimize(Calls(lambda z: z * 2), torch.randn(4, dtype=torch.complex64).to(torch.complex32))


def test_a_transform_too_long_for_a_dense_product_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match="a Fourier transform along an axis of 5000"):
        emmy.optimize(Calls(lambda x: torch.fft.rfft(x).abs()), torch.randn(2, 5000))
