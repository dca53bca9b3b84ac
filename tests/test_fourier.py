"""Fourier transforms of complex pairs (emmy.decompose.fourier) and the complex ops around them:
each program runs in the simulator (ASan) against torch's float64 run."""

import pytest
import torch

import emmy
from emmy.errors import UnsupportedOpError
from emmy.runtime import check_program


class Calls(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


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
    "power_spectrogram": (lambda x: torch.stft(x, 16, hop_length=4, window=torch.hann_window(16),
                                               return_complex=True).abs().pow(2), (torch.randn(2, 64),)),
    "spectral_conv": (SpectralConv(), (torch.randn(2, 3, 8, 8),)),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_fourier_programs_run_right_in_the_simulator(name):
    fn, inputs = PROGRAMS[name]
    module = fn if isinstance(fn, torch.nn.Module) else Calls(fn)
    torch.manual_seed(0)
    program = emmy.optimize(module, *inputs)
    checks = check_program(program, mode="asan")
    assert checks and all(c.ok for c in checks), checks


def test_a_transform_too_long_for_a_dense_product_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match="a Fourier transform along an axis of 5000"):
        emmy.optimize(Calls(lambda x: torch.fft.rfft(x).abs()), torch.randn(2, 5000))
