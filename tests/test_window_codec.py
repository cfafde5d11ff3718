"""The ``window`` codec: max-pool indices stored exactly as their tap inside the pooling window."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcdl
from hpcdl.compress import CodecError, Packed, get_codec
from hpcdl.compress.window import CHUNK
from hpcdl.runtime.classify import pool_window

POOLS = {1: (F.max_pool1d, nn.MaxPool1d), 2: (F.max_pool2d, nn.MaxPool2d), 3: (F.max_pool3d, nn.MaxPool3d)}
GEOMETRIES = [  # dims, kernel, stride, padding, dilation, ceil_mode
    (2, 2, 2, 0, 1, False),
    (2, 3, 2, 1, 1, False),
    (2, (3, 2), (1, 2), (1, 0), (2, 1), True),
    (1, 3, 2, 1, 2, True),
    (1, 16, 16, 0, 1, False),  # 16 taps: 4 bits
    (3, 2, 2, 0, 1, False),
    (3, (1, 3, 3), (1, 2, 2), (0, 1, 1), 1, False),
    (2, 16, 1, 0, 1, False),  # 256 taps: 8 bits
]


def per_dim(value, dims):
    return list(value) if isinstance(value, tuple) else [value] * dims


def pooled(dims, kernel, stride, padding, dilation, ceil_mode, x):
    functional, _ = POOLS[dims]
    return functional(x, kernel, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=True)[1]


def config_for(dims, kernel, stride, padding, dilation, spatial):
    return {"id": "window", "input": list(spatial), "kernel": per_dim(kernel, dims), "stride": per_dim(stride, dims),
            "padding": per_dim(padding, dims), "dilation": per_dim(dilation, dims)}


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("values", ["normal", "relu", "ties", "nan"])
def test_round_trip_is_exact_for_every_geometry(geometry, values):
    dims = geometry[0]
    spatial = (19, 23, 9)[:dims] if geometry[1] != 16 or dims == 1 else (33, 35)
    if geometry[1] == 16 and dims == 1:
        spatial = (64,)
    x = torch.randn((2, 3, *spatial), generator=torch.Generator().manual_seed(dims))
    if values == "relu":
        x = torch.relu(x)
    elif values == "ties":
        x = torch.zeros_like(x)
    elif values == "nan":
        x[0, 0].view(-1)[::5] = float("nan")
    index = pooled(*geometry, x)
    codec = get_codec(config_for(*geometry[:5], spatial))
    packed = codec.encode(index)
    restored = codec.decode(packed)
    assert restored.dtype == torch.int64 and torch.equal(restored, index)
    assert torch.equal(codec.decode(Packed.from_bytes(packed.to_bytes())), index)


def test_a_two_by_two_window_costs_two_bits_an_index():
    x = torch.randn(4, 16, 64, 64)
    index = pooled(2, 2, 2, 0, 1, False, x)
    packed = get_codec(config_for(2, 2, 2, 0, 1, (64, 64))).encode(index)
    assert packed.data.numel() == index.numel() * 2 // 8
    assert index.numel() * 8 / packed.nbytes > 31  # against int64


def test_tensors_larger_than_a_chunk_and_without_batch_dims_round_trip():
    x = torch.randn(3, 2 * CHUNK // 1000 + 1, 1000)  # planes of 1000 outputs: chunks end inside no plane
    index = pooled(1, 2, 2, 0, 1, False, x)
    codec = get_codec(config_for(1, 2, 2, 0, 1, (1000,)))
    assert torch.equal(codec.decode(codec.encode(index)), index)
    single = pooled(2, 2, 2, 0, 1, False, torch.randn(1, 8, 8))[0]  # (4, 4): no leading dims at all
    assert torch.equal(get_codec(config_for(2, 2, 2, 0, 1, (8, 8))).decode(
        get_codec(config_for(2, 2, 2, 0, 1, (8, 8))).encode(single)), single)
    empty = torch.empty(0, 3, 4, 4, dtype=torch.int64)
    assert torch.equal(get_codec(config_for(2, 2, 2, 0, 1, (8, 8))).decode(
        get_codec(config_for(2, 2, 2, 0, 1, (8, 8))).encode(empty)), empty)


def test_indices_of_another_geometry_are_refused_not_stored_wrongly():
    index = pooled(2, 3, 2, 1, 1, False, torch.randn(2, 3, 20, 20))
    with pytest.raises(ValueError, match="outside its element's"):
        get_codec(config_for(2, 2, 2, 0, 1, (20, 20))).encode(index[..., :10, :10])
    with pytest.raises(ValueError, match="outside the pooled input"):
        get_codec(config_for(2, 3, 2, 1, 1, (10, 10))).encode(index)
    with pytest.raises(ValueError, match="outside the pooled input"):
        get_codec(config_for(2, 3, 2, 1, 1, (20, 20))).encode(index - 1)


@pytest.mark.parametrize("bad,message", [
    ({"input": [4, 4], "kernel": [2]}, "same 1 to 3 spatial dims"),
    ({"input": [0, 4]}, "input size must be >= 1"),
    ({"kernel": [17, 17]}, "more than the 256"),
    ({"stride": [0, 1]}, "between 1 and"),
    ({"padding": [-1, 0]}, "padding must be"),
    ({"dilation": [1.5, 1]}, "list of integers"),
    ({"input": [1, 2, 3, 4], "kernel": [1] * 4, "stride": [1] * 4, "padding": [0] * 4, "dilation": [1] * 4},
     "same 1 to 3"),
])
def test_bad_configs_say_what_is_wrong(bad, message):
    config = {**config_for(2, 2, 2, 0, 1, (8, 8)), **bad}
    with pytest.raises(ValueError, match=message):
        get_codec(config)


def test_forged_taps_past_the_window_or_into_the_padding_are_codec_errors():
    from hpcdl.compress.checksum import payload_checksum
    codec = get_codec(config_for(2, 3, 2, 1, 1, (8, 8)))
    index = pooled(2, 3, 2, 1, 1, False, torch.randn(1, 1, 8, 8))
    packed = codec.encode(index)
    for forged_value in (0xFF, 0x00):  # taps 15 (past 9), and tap 0 everywhere: the top-left corner is padding
        data = torch.full_like(packed.data, forged_value)
        header = bytearray(packed.header)
        forged = Packed(_with_checksum(bytes(header), payload_checksum(data)), data)
        with pytest.raises(CodecError, match="past its|outside the pooled input"):
            codec.decode(forged)


def _with_checksum(header: bytes, checksum: int) -> bytes:
    """The header rewritten with another payload checksum (and a valid header CRC)."""
    from hpcdl.compress.header import read_header, write_header
    parsed = read_header(header, "window", "BB" + "QHHHH" * 3)
    return write_header("window", parsed.dtype, parsed.shape, "BB" + "QHHHH" * 3, *parsed.fields, checksum=checksum)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_pool_window_reads_the_module_and_its_input(dims):
    _, module_class = POOLS[dims]
    module = module_class(3, stride=2, padding=1, dilation=1)
    x = torch.randn(2, 4, *(10,) * dims)
    config = pool_window(module, (x,))
    assert config == config_for(dims, 3, 2, 1, 1, (10,) * dims)
    assert pool_window(module_class(2), (x,))["stride"] == [2] * dims  # stride None means the kernel
    assert pool_window(nn.ReLU(), (x,)) is None
    assert pool_window(nn.AdaptiveMaxPool2d(3), (x,)) is None  # windows of varying size: the int codec
    assert pool_window(module_class({1: 257, 2: 17, 3: 7}[dims]), (x,)) is None  # more taps than 8 bits number


def test_the_session_stores_max_pool_indices_as_window_taps_with_exact_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3),
                          nn.MaxPool2d(3, 2, 1), nn.Flatten(), nn.Linear(8 * 15 * 15, 2))
    x = torch.randn(4, 3, 64, 64)

    def gradients(policy):
        model.zero_grad()
        context = hpcdl.compressed(model, policy, threshold=0) if policy else torch.enable_grad()
        with context as session:
            out = model(x)
        out.square().sum().backward()
        return [p.grad.clone() for p in model.parameters()], session

    exact, _ = gradients(None)
    compressed, session = gradients(hpcdl.Policy.static({"id": "raw"}))
    assert all(torch.equal(a, b) for a, b in zip(exact, compressed))
    two, three = session.stats.row("2", "index"), session.stats.row("4", "index")
    assert two.original / two.packed > 25  # 2x2: 2 bits each, plus a header
    assert three.original / three.packed > 12  # 3x3: 4 bits each


def test_a_policy_with_its_own_index_codec_keeps_it():
    policy = hpcdl.Policy(hpcdl.runtime.policy.StaticController(None), indices={"id": "raw"})
    window = config_for(2, 2, 2, 0, 1, (8, 8))
    info = policy.info("pool", "index", torch.zeros(1, 1, 4, 4, dtype=torch.int64), window)
    assert policy.codec_for(info).codec_id == "raw"
    default = hpcdl.Policy.static(None)
    assert default.codec_for(default.info("pool", "index", torch.zeros(1, dtype=torch.int64), window)).codec_id == "window"
