"""Antialiased resizing (emmy.decompose.resample): torch's own weights, applied as two constant
matrices, compiled and run in the simulator under ASan against torch."""

import pytest
import torch
import torch.nn.functional as F

import emmy


class Resize(torch.nn.Module):
    def __init__(self, mode, size=None, scale=None, align_corners=False):
        super().__init__()
        self.mode, self.size, self.scale, self.align_corners = mode, size, scale, align_corners

    def forward(self, x):
        return F.interpolate(x, size=self.size, scale_factor=self.scale, mode=self.mode, antialias=True,
                             align_corners=self.align_corners) * 2


SHAPES = [
    # (input shape, size, scale factor, align_corners): down, up, both at once, by a scale, one column
    ((2, 3, 14, 9), (5, 7), None, False),
    ((1, 2, 6, 8), (20, 11), None, True),
    ((1, 2, 9, 10), None, (0.5, 1.7), False),
    ((1, 1, 12, 1), (5, 1), None, False),
]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape,size,scale,align_corners", SHAPES, ids=["down", "up", "scale", "one-column"])
def test_antialiased_resizes_run_like_torch(mode, shape, size, scale, align_corners):
    module = Resize(mode, size, scale, align_corners)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    program = emmy.optimize(module, x)
    torch.testing.assert_close(program(x, sim_mode="asan"), module(x), rtol=1e-5, atol=1e-5)


def test_a_position_embedding_resampled_in_every_forward_beside_a_class_token():
    """timm's ViTs with dynamic_img_size resample their position grid each call, then add it to
    the patches after the class token."""

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
            self.pos = torch.nn.Parameter(torch.randn(1, 9, 8))

        def forward(self, patches):
            grid = self.pos.reshape(1, 3, 3, 8).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(2, 2), mode="bicubic", antialias=True)
            return torch.cat([self.cls, patches + grid.flatten(2).transpose(1, 2)], dim=1)

    module, patches = Embed(), torch.randn(1, 4, 8)
    got = emmy.optimize(module, patches)(patches, sim_mode="asan")
    torch.testing.assert_close(got, module(patches).detach(), rtol=1e-5, atol=1e-5)
