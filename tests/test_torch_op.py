"""tensorlang.torch.op: custom ops with fake kernels and derived autograd (gradcheck, torch.compile, a trained model)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tensorlang as tl


def test_import_tensorlang_does_not_import_torch():
    code = "import sys, tensorlang; tensorlang.compile; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


torch = pytest.importorskip("torch")
tlt = pytest.importorskip("tensorlang.torch")

MATMUL_TANH = """def mt(double(M,K) A, double(K,N) B) -> (C) {
  H(m,n) +=! A(m,k) * B(k,n)
  C(m,n) = tanh(H(m,n))
}"""
SOFTMAX = """def sm(double(N,D) X) -> (Y) {
  mx(n) max=! X(n,d)
  e(n,d) = exp(X(n,d) - mx(n))
  s(n) +=! e(n,d)
  Y(n,d) = e(n,d) / s(n)
}"""
CONV = "def cv(double(N,C,H,W) I, double(F,C,KH,KW) Wt) -> (O) { O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw) }"
TWO_OUT = """def two(double(N) X, int32(N) Sel, double(N) Y) -> (S, P) {
  S(i) = Sel(i) > 0 ? X(i) * Y(i) : X(i)
  P +=! X(i) * X(i)
}"""

MLP = """def mlp(float(B, M) I, float(N, M) W1, float(N) B1, float(P, N) W2, float(P) B2) -> (O2) {
    H1(b, n) +=! I(b, m) * W1(n, m)
    H1(b, n) = fmax(H1(b, n) + B1(n), 0)
    O2(b, p) +=! H1(b, n) * W2(p, n)
    O2(b, p) = O2(b, p) + B2(p)
}"""
ATTENTION = """def attention(float(B, T, D) Q, float(B, S, D) K, float(B, S, E) V) -> (O) {
    A(b, t, s) +=! Q(b, t, d) * K(b, s, d)
    mx(b, t) max=! A(b, t, s)
    P(b, t, s) = exp(A(b, t, s) - mx(b, t))
    z(b, t) +=! P(b, t, s)
    O(b, t, e) +=! P(b, t, s) * V(b, s, e)
    O(b, t, e) = O(b, t, e) / z(b, t)
}"""


def f64(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize(
    ("source", "shapes"),
    [(MATMUL_TANH, [(6, 5), (5, 4)]), (SOFTMAX, [(4, 7)]), (CONV, [(1, 2, 6, 5), (3, 2, 3, 2)])],
    ids=["matmul_tanh", "softmax", "conv2d"],
)
def test_gradcheck_float64(source, shapes):
    torch.manual_seed(0)
    op = tlt.op(source)
    args = [f64(*s) for s in shapes]
    assert isinstance(op(*args), torch.Tensor)
    assert torch.autograd.gradcheck(op, args, eps=1e-6, atol=1e-6)


def test_several_outputs_and_an_integer_input():
    torch.manual_seed(1)
    op = tlt.op(TWO_OUT)
    x, y = f64(6), f64(6)
    sel = torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.int32)
    s, p = op(x, sel, y)
    torch.testing.assert_close(s, torch.where(sel > 0, x * y, x))
    torch.testing.assert_close(p, (x * x).sum())
    assert torch.autograd.gradcheck(lambda a, b: op(a, sel, b), [x, y], eps=1e-6, atol=1e-6)
    (s.sum() + p).backward()
    assert x.grad is not None and y.grad is not None


def test_the_same_program_gives_the_same_op_and_opcheck_passes():
    op = tlt.op(MATMUL_TANH)
    assert tlt.op(MATMUL_TANH) is op
    assert tlt.op(MATMUL_TANH, options=tl.Options(threads=1)) is not op
    assert str(op._qualname).startswith("tensorlang::mt_")
    result = torch.library.opcheck(op, (f64(3, 2), f64(2, 4)))
    assert set(result.values()) == {"SUCCESS"}


def test_only_the_inputs_the_gradient_reads_are_saved():
    op = tlt.op("def f(double(N) A, double(N) B) -> (C) { C(i) = A(i) * 2.0 + B(i) * B(i) }")
    a, b = f64(5), f64(5)
    c = op(a, b)
    saved = c.grad_fn.saved_tensors
    assert len(saved) == 1 and torch.equal(saved[0], b)
    c.sum().backward()
    torch.testing.assert_close(a.grad, torch.full((5,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(b.grad, 2 * b.detach())


def test_fake_tensors_get_shapes_without_compiling():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = tlt.op(CONV)
    before = op.kernel.compile_count
    with FakeTensorMode():
        out = op(torch.empty(2, 3, 9, 8, dtype=torch.float64), torch.empty(4, 3, 3, 2, dtype=torch.float64))
    assert tuple(out.shape) == (2, 4, 7, 7) and out.dtype == torch.float64
    meta = op(
        torch.empty(1, 3, 5, 5, dtype=torch.float64, device="meta"),
        torch.empty(2, 3, 2, 2, dtype=torch.float64, device="meta"),
    )
    assert meta.device.type == "meta" and tuple(meta.shape) == (1, 2, 4, 4)
    assert op.kernel.compile_count == before


def test_errors_name_the_input():
    op = tlt.op(MATMUL_TANH)
    with pytest.raises(
        tl.ArgumentError, match=r"input B expected type float64 \(torch.float64\) but found torch.float32"
    ):
        op(torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 2))
    with pytest.raises(tl.ArgumentError, match="mismatched sizes for K"):
        op(torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64))


def test_a_def_without_gradient_raises_at_backward():
    op = tlt.op("def g(double(N) X, int32(M) Idx) -> (Y) { Y(j) = X(Idx(j)) }")
    x = f64(4)
    y = op(x, torch.tensor([0, 3], dtype=torch.int32))
    torch.testing.assert_close(y, x[[0, 3]])
    try:
        y.sum().backward()
    except tl.TensorLangError as e:
        assert "g: no gradient" in str(e)
    else:  # tl.grad learnt gathers: the gradient must then be right
        torch.testing.assert_close(x.grad, torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64))


def test_torch_compile_fullgraph_without_graph_breaks():
    import torch._dynamo as dynamo

    op = tlt.op("def lin(float(B,K) X, float(K,N) W) -> (H) { H(i,j) +=! X(i,k) * W(k,j) }")

    def model(x, w):
        return torch.relu(op(x, w)).sum()

    torch.manual_seed(2)
    x, w = torch.randn(8, 6), torch.randn(6, 5, requires_grad=True)
    dynamo.reset()
    explain = dynamo.explain(model)(x, w)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(
        model, fullgraph=True, backend="aot_eager"
    )  # AOTAutograd traces the backward op too
    yc = compiled(x, w)
    yc.backward()
    gc, w.grad = w.grad.clone(), None
    ye = model(x, w)
    ye.backward()
    torch.testing.assert_close(yc, ye)
    torch.testing.assert_close(gc, w.grad)


# ---------------------------------------------------------------------- the README's nn.Module example

# ops are made once, outside forward: torch.compile traces calls of an op, not tlt.op itself
mlp_op = tlt.op(MLP)
attention_op = tlt.op(ATTENTION)


class TensorlangModel(torch.nn.Module):
    """Self-attention over a sequence, mean-pooled, then a two-layer MLP: the attention and the MLP in tensorlang."""

    def __init__(self, d=8, hidden=16, classes=3):
        super().__init__()
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, d, bias=False)
        self.v = torch.nn.Linear(d, d, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(hidden, d) / d**0.5)
        self.b1 = torch.nn.Parameter(torch.zeros(hidden))
        self.w2 = torch.nn.Parameter(torch.randn(classes, hidden) / hidden**0.5)
        self.b2 = torch.nn.Parameter(torch.zeros(classes))
        self.scale = d**-0.5

    def attention(self, q, k, v):
        return attention_op(q, k, v)

    def mlp(self, h):
        return mlp_op(h, self.w1, self.b1, self.w2, self.b2)

    def forward(self, x):
        h = self.attention(self.q(x) * self.scale, self.k(x), self.v(x)).mean(dim=1)
        return self.mlp(h)


class TorchModel(TensorlangModel):
    """The same model in PyTorch."""

    def attention(self, q, k, v):
        return torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v

    def mlp(self, h):
        return torch.relu(h @ self.w1.T + self.b1) @ self.w2.T + self.b2


def train(model, xs, ys, steps=5):
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def test_training_matches_pytorch():
    torch.manual_seed(3)
    xs, ys = torch.randn(16, 5, 8), torch.randint(0, 3, (16,))
    ours = TensorlangModel()
    theirs = TorchModel()
    theirs.load_state_dict(ours.state_dict())
    got, expected = train(ours, xs, ys), train(theirs, xs, ys)
    assert got[-1] < got[0]
    assert got == pytest.approx(expected, rel=1e-4)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_training_under_torch_compile_matches_eager():
    torch.manual_seed(4)
    xs, ys = torch.randn(8, 5, 8), torch.randint(0, 3, (8,))
    ours = TensorlangModel()
    theirs = TensorlangModel()
    theirs.load_state_dict(ours.state_dict())
    compiled = torch.compile(ours, fullgraph=True)  # the default back end (Inductor)
    assert train(compiled, xs, ys, steps=3) == pytest.approx(train(theirs, xs, ys, steps=3), rel=1e-5)
