"""Convolution and batch-norm backward over chunks of the batch (hpcdl.runtime.chunked), alone and under a session."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

import hpcdl
from hpcdl.runtime.chunked import ChunkedConvolution, chunked_layers
from hpcdl.runtime.methods import Codec, Recompute, train_step


class BackwardBatches(TorchDispatchMode):
    """Records the batch size of every aten.convolution_backward (and forward) call, and counts whole-batch norm
    backwards."""

    def __init__(self):
        super().__init__()
        self.batches = []
        self.forward_batches = []
        self.batch_norm_backwards = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution_backward.default:
            self.batches.append(args[1].shape[0])
        if func is torch.ops.aten.convolution.default:
            self.forward_batches.append(args[0].shape[0])
        if func is torch.ops.aten.native_batch_norm_backward.default:
            self.batch_norm_backwards += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dims, stride, padding, dilation, groups, bias", [
    (1, (2,), (1,), (1,), 1, True),
    (2, (1, 2), (2, 1), (2, 1), 2, True),
    (2, (1, 1), (0, 0), (1, 1), 1, False),
    (3, (1, 1, 2), (1, 0, 1), (1, 1, 1), 1, True),
])
def test_chunked_convolution_gradients_are_exact(dims, stride, padding, dilation, groups, bias):
    generator = torch.Generator().manual_seed(dims)
    x = torch.randn(5, 4, *([7] * dims), dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(6, 4 // groups, *([3] * dims), dtype=torch.float64, generator=generator, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, generator=generator, requires_grad=True) if bias else None
    inputs = (x, weight, b) if bias else (x, weight)

    def conv(x, weight, b=None):
        return ChunkedConvolution.apply(x, weight, b, stride, padding, dilation, groups, 2)  # chunks of 2, 2, 1

    assert torch.autograd.gradcheck(conv, inputs)
    plain = torch.convolution(x, weight, b, stride, padding, dilation, False, [0] * dims, groups)
    torch.testing.assert_close(conv(*inputs), plain)  # the forward also runs in chunks: equal up to rounding


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_chunked_convolution_output_keeps_the_memory_format(memory_format):
    x = torch.randn(5, 4, 9, 9).contiguous(memory_format=memory_format)
    weight = torch.randn(6, 4, 3, 3).contiguous(memory_format=memory_format)
    got = ChunkedConvolution.apply(x, weight, None, (1, 1), (1, 1), (1, 1), 1, 2)
    plain = torch.convolution(x, weight, None, (1, 1), (1, 1), (1, 1), False, [0, 0], 1)
    assert got.is_contiguous(memory_format=memory_format) == plain.is_contiguous(memory_format=memory_format)
    torch.testing.assert_close(got, plain)


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))


def gradients(model, x, y, method=None, chunk_bytes=None):
    model.zero_grad(set_to_none=True)
    if method is not None:
        train_step(model, method, x, y, nn.functional.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.0))
    else:
        nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_session_runs_large_convolutions_backward_in_chunks():
    model = small_cnn()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1] * 3)
    exact = gradients(model, x, y)
    per_sample = 8 * 16 * 16 * 4  # the second convolution's input, one sample
    recorder = BackwardBatches()
    with recorder:
        chunked = gradients(model, x, y, Codec("raw", threshold=0, chunk_bytes=2 * per_sample))
    # the first convolution's input (3 channels) fits 5 samples a chunk; the second's 2: forward and backward
    assert sorted(recorder.batches) == [1, 2, 2, 2, 5]
    assert sorted(recorder.forward_batches) == [1, 2, 2, 2, 5]
    assert recorder.batch_norm_backwards == 0  # the batch norm (8 channels) ran its chunks itself
    for got, want in zip(chunked, exact):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not any("forward" in vars(module) for module in model.modules()), "the session left a patched forward"


def test_chunk_bytes_zero_runs_every_backward_whole_and_lossless_stays_bit_identical():
    model = small_cnn()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1] * 3)
    exact = gradients(model, x, y)
    recorder = BackwardBatches()
    with recorder:
        whole = gradients(model, x, y, Codec("raw", threshold=0, chunk_bytes=0))
    assert recorder.batches == [6, 6] and recorder.batch_norm_backwards == 1
    assert all(torch.equal(got, want) for got, want in zip(whole, exact))


def test_checkpointed_regions_run_plainly_and_recompute_the_same():
    """A recomputed region must save in backward what it saved in forward. A layer that is itself a block of the
    recompute method has its forward replaced, so it runs whole; a model's own torch.utils.checkpoint region runs
    plainly, since its recomputation comes after the session closed. (Layers inside a recompute block run in
    chunks in both passes: tests/test_recompute.py.)"""
    model = small_cnn()
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1] * 2)
    exact = gradients(model, x, y)
    recorder = BackwardBatches()
    with recorder:
        got = gradients(model, x, y, Recompute([model[1], model[3]]) + Codec("raw", threshold=0, chunk_bytes=1))
    assert recorder.batches == [4, 1, 1, 1, 1]  # the second convolution (a block) whole; the first chunked
    assert recorder.batch_norm_backwards == 1  # a block, so whole
    for g, want in zip(got, exact):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)

    class OwnCheckpoint(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.layers, x, use_reentrant=False)

    inner = small_cnn()
    model = nn.Sequential(OwnCheckpoint(inner[:3]), inner[3:])
    exact = gradients(model, x, y)
    with recorder:
        got = gradients(model, x, y, Codec("sz:rel=1e-9", threshold=0, chunk_bytes=1))
    for g, want in zip(got, exact):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape, affine, momentum", [
    ((7, 3), True, 0.1),
    ((7, 3, 5), False, 0.1),
    ((7, 3, 4, 5), True, None),
    ((7, 3, 2, 3, 4), True, 0.3),
])
def test_chunked_batch_norm_matches_plain_training(shape, affine, momentum):
    kind = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    plain, chunked = (kind(3, affine=affine, momentum=momentum).double() for _ in range(2))
    if affine:
        for norm in (plain, chunked):
            with torch.no_grad():
                norm.weight.copy_(torch.tensor([0.5, 2.0, -1.0]))
                norm.bias.copy_(torch.tensor([0.1, 0.0, -0.3]))
    generator = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(shape, dtype=torch.float64, generator=generator) * 3 + 1).requires_grad_()
    dy = torch.randn(shape, dtype=torch.float64, generator=generator)
    want = plain(x)
    want_grads = torch.autograd.grad(want, [x, *plain.parameters()], dy)
    per_sample = x[0].numel() * 8
    for _ in range(2):  # the second step checks the running statistics' update again
        with chunked_layers(chunked, 3 * per_sample) as patched:
            got = chunked(x)
        assert patched == 1 and type(got.grad_fn).__name__ == "ChunkedBatchNormBackward"
    plain(x)
    assert torch.equal(got, want)
    got_grads = torch.autograd.grad(got, [x, *chunked.parameters()], dy)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(chunked, name), getattr(plain, name), rtol=1e-12, atol=0)
    assert torch.autograd.gradcheck(lambda x: chunked_training(chunked, x, 3 * per_sample), (x,))


@pytest.mark.parametrize("dtype, parameters", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                               (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16)])
def test_chunked_batch_norm_of_a_half_precision_input_rounds_its_gradients_once(dtype, parameters):
    """A bf16/fp16 input, with float32 or half-precision parameters and statistics: the gradients are computed in
    float32 and rounded once, as plain autograd's are (summing the incoming gradient in half precision put 4% of
    bf16's input gradient off; computing in a half-precision model's statistics' precision, 39%)."""
    plain, chunked = nn.BatchNorm2d(8).to(parameters), nn.BatchNorm2d(8).to(parameters)
    for norm in (plain, chunked):
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
            norm.bias.copy_(torch.linspace(-0.3, 0.3, 8))
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 8, 16, 16, generator=generator) * 3 + 1).to(dtype).requires_grad_()
    dy = torch.randn(4, 8, 16, 16, generator=generator).to(dtype)
    with chunked_layers(chunked, x[0].numel() * x.element_size()):
        got = chunked(x)
    assert type(got.grad_fn).__name__ == "ChunkedBatchNormBackward"
    got_x, got_weight, got_bias = torch.autograd.grad(got, [x, chunked.weight, chunked.bias], dy)
    want_x, want_weight, want_bias = torch.autograd.grad(plain(x), [x, plain.weight, plain.bias], dy)
    assert got_x.dtype == dtype and (got_x == want_x).float().mean() > 0.999
    torch.testing.assert_close(got_x, want_x)  # the rest within the dtype's rounding
    torch.testing.assert_close(got_weight, want_weight, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_bias, want_bias, rtol=1e-5, atol=1e-5)


def test_chunked_convolution_of_a_half_precision_weight_sums_its_chunks_gradients_before_rounding():
    """64 chunks' weight and bias gradients are summed in float32 and rounded to bf16 once: no further from the
    float64 gradients than plain autograd's (summed in bf16, the bias's was 2.9x further)."""
    plain, chunked = nn.Conv2d(4, 4, 3, padding=1).bfloat16(), nn.Conv2d(4, 4, 3, padding=1).bfloat16()
    chunked.load_state_dict(plain.state_dict())
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 4, 8, 8, generator=generator) + 0.5).bfloat16().requires_grad_()
    dy = (torch.randn(64, 4, 8, 8, generator=generator) + 0.5).bfloat16()
    with chunked_layers(chunked, x[0].numel() * x.element_size()):  # one sample a chunk
        got = chunked(x)
    assert type(got.grad_fn).__name__ == "ChunkedConvolutionBackward"
    got_grads = torch.autograd.grad(got, [chunked.weight, chunked.bias], dy)
    plain_grads = torch.autograd.grad(plain(x), [plain.weight, plain.bias], dy)
    weight, bias = (t.detach().double().requires_grad_() for t in (plain.weight, plain.bias))
    exact = torch.autograd.grad(F.conv2d(x.detach().double(), weight, bias, padding=1), [weight, bias], dy.double())
    for got_grad, plain_grad, want in zip(got_grads, plain_grads, exact):
        errors = [float(((grad.double() - want).abs() / want.abs()).max()) for grad in (got_grad, plain_grad)]
        assert got_grad.dtype == torch.bfloat16 and errors[0] <= 1.2 * errors[1], errors


def chunked_training(norm, x, chunk_bytes):
    with chunked_layers(norm, chunk_bytes):
        return norm(x)


def _most_bytes_allocated_during(run) -> int:
    """The most bytes PyTorch's CPU allocator held at once while ``run()`` ran, above what it held before."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = []  # (time, bytes (negative: freed), allocator total after it)

    def walk(node):
        if type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            events.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.total_allocated))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    events.sort(key=lambda event: event[0])
    before = events[0][2] - events[0][1]
    return max(total for _, _, total in events) - before


def test_chunked_batch_norm_backward_holds_no_chunk_sized_temporaries():
    """The input's gradient is the only input-sized buffer; each chunk's gradient is computed in its rows (the
    formula written out would hold up to three chunk-sized temporaries beside it)."""
    norm = nn.BatchNorm2d(8)
    x = torch.randn(4, 8, 64, 64, requires_grad=True)
    with chunked_layers(norm, x[0].numel() * x.element_size()):
        y = norm(x)
    assert type(y.grad_fn).__name__ == "ChunkedBatchNormBackward"
    dy = torch.randn_like(y)
    held = _most_bytes_allocated_during(lambda: y.backward(dy))
    gradient = x.numel() * x.element_size()
    assert gradient <= held <= gradient + 4096  # + the per-channel sums and factors


def test_batch_norm_in_evaluation_runs_plainly():
    norm = nn.BatchNorm2d(2).eval()
    with chunked_layers(norm, 1):
        out = norm(torch.randn(4, 2, 3, 3, requires_grad=True))
    assert type(out.grad_fn).__name__ != "ChunkedBatchNormBackward"


class OwnForward(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


def test_only_plain_convolutions_are_patched_and_restored():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), OwnForward(4, 4, 3), nn.Conv2d(4, 4, 3, padding="same"),
                          nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), nn.Conv1d(4, 4, 1))
    instance_forward = nn.Conv2d(4, 4, 1)
    instance_forward.forward = lambda x: x
    model.append(instance_forward)
    with chunked_layers(model, 1) as patched:
        assert patched == 2  # the first Conv2d and the Conv1d
        assert "forward" in vars(model[0]) and "forward" in vars(model[4])
    assert "forward" not in vars(model[0]) and "forward" not in vars(model[4])
    assert vars(instance_forward)["forward"](3) == 3


def test_unbatched_and_gradient_free_inputs_run_plainly():
    conv = nn.Conv2d(2, 3, 3)
    with chunked_layers(conv, 1):
        assert conv(torch.randn(2, 5, 5)).shape == (3, 3, 3)  # no batch dimension
        assert conv(torch.randn(0, 2, 5, 5)).shape == (0, 3, 3, 3)  # an empty batch
        with torch.no_grad():
            assert conv(torch.randn(4, 2, 5, 5)).grad_fn is None
        out = conv(torch.randn(4, 2, 5, 5))
        assert type(out.grad_fn).__name__ == "ChunkedConvolutionBackward"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "32MiB"])
def test_bad_chunk_bytes_is_refused_with_what_is_valid(bad):
    with pytest.raises(ValueError, match="chunk_bytes .* int >= 0"):
        hpcdl.compressed(nn.Conv2d(1, 1, 1), "sz:rel=1e-2", chunk_bytes=bad)


def test_a_decoded_input_only_this_layer_still_needs_takes_its_gradient(monkeypatch):
    """The batch norm's input is saved by it alone: its backward writes the input gradient over the decoded
    input. The second convolution's input is the first ReLU's output, which the ReLU saved too and still needs:
    it is not handed over (the ReLU would otherwise decode it a second time)."""
    from hpcdl.runtime import session as session_module

    model = small_cnn()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1] * 3)
    exact = gradients(model, x, y)
    claimed = []
    claim = session_module.Session._claim_decoded

    def recording_claim(self, tensor):
        claimed.append((tuple(tensor.shape), claim(self, tensor)))
        return claimed[-1][1]

    monkeypatch.setattr(session_module.Session, "_claim_decoded", recording_claim)
    got = gradients(model, x, y, Codec("raw", threshold=0, chunk_bytes=2 * 8 * 16 * 16 * 4))
    assert claimed == [((6, 8, 16, 16), False), ((6, 8, 16, 16), True)]  # the convolution's, the batch norm's
    for g, want in zip(got, exact):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)


def test_a_second_backward_through_a_handed_over_input_decodes_it_afresh():
    """retain_graph: the second backward unpacks the batch norm's input again; it must not read the first
    backward's gradient, which was written over the decoded input."""
    model = small_cnn()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1] * 3)
    with hpcdl.compressed(model, "raw", threshold=0, chunk_bytes=2 * 8 * 16 * 16 * 4):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    once = [p.grad.clone() for p in model.parameters()]
    loss.backward()
    for twice, first in zip(model.parameters(), once):
        torch.testing.assert_close(twice.grad, 2 * first)


def test_inputs_kept_as_they_are_are_never_overwritten():
    model = small_cnn()
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1] * 3)
    with hpcdl.compressed(model, None, threshold=0, chunk_bytes=1):  # no codec: every saved tensor kept as it is
        hidden = model[:3](x)
        kept = hidden.detach().clone()
        out = model[3:](hidden)
    nn.functional.cross_entropy(out, y).backward()
    assert torch.equal(hidden.detach(), kept)
