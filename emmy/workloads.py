"""The reference workloads, as `-c` code.

`code` uses the shapes the tests and the suite run; `bench_code`, where the
benchmark shape differs, the larger one; `sim_code`, where `code` is too much
work for the CPU simulator (billions of thread-steps), the same program at a
small shape, which the simulator runs instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    code: str
    notes: str
    bench_code: str | None = None
    sim_code: str | None = None


def _matmul(n: int) -> str:
    return (f"a=torch.randn({n},{n},dtype=torch.float16); b=torch.randn({n},{n},dtype=torch.float16); "
            "torch.matmul(a, b)")


def _attention(seq: int, causal: bool, heads: int = 8) -> str:
    return (f"q=torch.randn(1,{heads},{seq},64,dtype=torch.float16); k=torch.randn(1,{heads},{seq},64,dtype=torch.float16); "
            f"v=torch.randn(1,{heads},{seq},64,dtype=torch.float16); "
            f"F.scaled_dot_product_attention(q, k, v, is_causal={causal})")


def _mlp(tokens: int, dim: int, hidden: int) -> str:
    return (f"x=torch.randn({tokens},{dim}); gate=nn.Linear({dim},{hidden},bias=False); "
            f"up=nn.Linear({dim},{hidden},bias=False); down=nn.Linear({hidden},{dim},bias=False); "
            "down(F.silu(gate(x)) * up(x))")


def _layernorm(dtype: str) -> str:
    return (f"x=torch.randn(8,1024,dtype=torch.{dtype}); w=torch.randn(1024,dtype=torch.{dtype}); "
            f"b=torch.randn(1024,dtype=torch.{dtype}); F.layer_norm(x,(1024,),w,b)")


_LLAMA_DECODER = """\
class Decoder(nn.Module):
    # A Llama decoder layer: RMSNorm, rotary embeddings from positions, grouped-query causal
    # attention, SiLU-gated MLP, residuals.

    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)

    def rotate(self, x, cos, sin):
        half = self.head // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    def grouped(self, x):
        b, g, t, d = x.shape
        return x[:, :, None].expand(b, g, self.heads // g, t, d).reshape(b, self.heads, t, d)

    def forward(self, x, positions):
        b, t, dim = x.shape
        inverse = 1.0 / (10000.0 ** (torch.arange(0, self.head, 2, dtype=torch.float32) / self.head))
        angles = positions[:, None].float() * inverse[None, :]
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos(), angles.sin()
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head).transpose(1, 2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, self.grouped(k), self.grouped(v), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, dim))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

"""


def _llama(tokens: int, dim: int, heads: int, kv_heads: int, hidden: int) -> str:
    return _LLAMA_DECODER + (f"x = torch.randn(1, {tokens}, {dim})\npositions = torch.arange({tokens})\n"
                             f"Decoder({dim}, {heads}, {kv_heads}, {hidden})(x, positions)\n")


def _lm_step(tokens: int, dim: int, vocab: int) -> str:
    """Token embedding, RMSNorm, LM head and cross entropy against next tokens (ignore_index kept)."""
    return (f"ids = torch.randint(0, {vocab}, ({tokens},)); targets = torch.randint(0, {vocab}, ({tokens},))\n"
            f"embed = nn.Embedding({vocab}, {dim}); norm = nn.RMSNorm({dim}, eps=1e-6)\n"
            f"head = nn.Linear({dim}, {vocab}, bias=False)\n"
            "F.cross_entropy(head(norm(embed(ids))), targets)\n")


_RESNET_BLOCK = """\
class Block(nn.Module):
    # A ResNet basic block in inference: conv-bn-relu, conv-bn, the residual, relu.

    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)
"""

_SEPARABLE_BLOCK = """\
class Separable(nn.Module):
    # A MobileNet depthwise-separable block in inference: depthwise 3x3, bn, relu6, pointwise 1x1, bn, relu6.

    def __init__(self, c, out):
        super().__init__()
        self.dw, self.bn1 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c)
        self.pw, self.bn2 = nn.Conv2d(c, out, 1, bias=False), nn.BatchNorm2d(out)

    def forward(self, x):
        return F.relu6(self.bn2(self.pw(F.relu6(self.bn1(self.dw(x))))))
"""


def _resnet_block(n: int, c: int, size: int) -> str:
    return _RESNET_BLOCK + (f"block = Block({c}).eval().half(); x = torch.randn({n}, {c}, {size}, {size}, "
                            "dtype=torch.float16)\nblock(x)\n")


def _separable_block(n: int, c: int, out: int, size: int) -> str:
    return _SEPARABLE_BLOCK + (f"block = Separable({c}, {out}).eval().half(); "
                               f"x = torch.randn({n}, {c}, {size}, {size}, dtype=torch.float16)\nblock(x)\n")


def _conv3d_pool(n: int, c: int, out: int, size: int) -> str:
    return (f"x = torch.randn({n}, {c}, {size}, {size}, {size}, dtype=torch.float16); "
            f"conv = nn.Conv3d({c}, {out}, 3, padding=1).half(); F.max_pool3d(F.relu(conv(x)), 2)")


WORKLOADS: tuple[Workload, ...] = (
    Workload("add3", "x=torch.randn(8); y=torch.randn(8); x+x+y", "canonical form"),
    Workload("matmul_small", "x=torch.randn(4,3); w=torch.randn(3,2); x @ w", "Tensor IR example"),
    Workload("rmsnorm", "x=torch.randn(1,32,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)",
             "one kernel, coop reduce"),
    Workload("layernorm", _layernorm("float32"), "Welford"),
    Workload("layernorm_bf16", _layernorm("bfloat16"), "Welford, bf16"),
    Workload("softmax", "x=torch.randn(64,1000); torch.softmax(x,-1)", "online softmax, ragged width"),
    Workload("matmul_f16", _matmul(128), "mma atoms, staging", bench_code=_matmul(4096)),
    Workload("attention", _attention(1024, False), "flash-style fold", sim_code=_attention(72, False, heads=2)),
    Workload("attention_causal", _attention(1024, True), "flash-style fold, causal mask",
             sim_code=_attention(72, True, heads=2)),
    Workload("mlp", _mlp(16, 256, 512), "multi-kernel, fused epilogues", bench_code=_mlp(128, 4096, 11008)),
    Workload("gelu_chain", "x=torch.randn(16,256); w=torch.randn(256,512); b=torch.randn(512); F.gelu(x @ w + b)",
             "epilogue fusion"),
    Workload("llama_decoder", _llama(64, 256, 8, 2, 512), "RoPE from positions, GQA 4:1, causal, SiLU MLP",
             sim_code=_llama(9, 56, 7, 1, 64)),
    Workload("lm_step", _lm_step(64, 256, 2048), "embedding gather, LM head, cross entropy",
             sim_code=_lm_step(16, 32, 200)),
    Workload("resnet_block", _resnet_block(8, 64, 56), "implicit GEMM on tensor cores, bn and residual fused",
             sim_code=_resnet_block(1, 16, 8)),
    Workload("separable_block", _separable_block(8, 64, 128, 56), "depthwise 3x3 as a row fold, pointwise 1x1",
             sim_code=_separable_block(1, 8, 16, 8)),
    Workload("conv3d_pool", _conv3d_pool(2, 16, 32, 32), "3-D convolution, relu, 3-D max pooling",
             sim_code=_conv3d_pool(1, 4, 8, 8)),
)


def block_stack(depth: int, dim: int = 256, tokens: int = 64):
    """(model, example input): `depth` blocks of x + fc2(gelu(fc1(layer_norm(x)))), f32 (the scaling
    benchmark's stack). torch is imported here, not by this module."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.ln(x))))

    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(depth)]), torch.randn(tokens, dim)


def decoder_stack(depth: int, dim: int = 768, heads: int = 12, tokens: int = 128):
    """(model, example input): `depth` GPT-2-like decoder layers (LayerNorm, causal attention, GELU
    MLP, residuals), f32, batch 1."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(dim, dim=-1)
            q, k, v = (z.view(b, t, heads, dim // heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, dim)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    torch.manual_seed(0)
    return nn.Sequential(*[Layer() for _ in range(depth)]), torch.randn(1, tokens, dim)


def get(name: str) -> Workload:
    for w in WORKLOADS:
        if w.name == name:
            return w
    from emmy.errors import EmmyError

    raise EmmyError(f"unknown workload {name!r}; workloads are {', '.join(w.name for w in WORKLOADS)}")
