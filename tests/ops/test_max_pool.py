"""`max_pool_ceil` is `F.max_pool2d(ceil_mode=True)` to the bit: values (NaN included), shape and memory format,
for the kernels MTCNN uses, on every small size (partial last windows included) and both memory formats."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpen_tune.face import samples
from gpen_tune.face.detect.mtcnn_nets import load_networks
from gpen_tune.ops.max_pool import MaxPoolCeil, max_pool_ceil


@pytest.mark.parametrize("kernel", [2, 3])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_equals_aten_max_pool_on_every_small_size(kernel, memory_format):
    gen = torch.Generator().manual_seed(kernel)
    checked = 0
    for h in range(kernel, 27):
        for w in range(kernel, 27, 3):
            x = torch.randn(2, 5, h, w, generator=gen)
            x[0, 1, h - 1, w - 1] = float("nan")                # in a partial last window when there is one
            x[1, 4, 0, 0] = float("-inf")
            x = x.contiguous(memory_format=memory_format)
            want = F.max_pool2d(x, kernel, 2, ceil_mode=True)
            got = max_pool_ceil(x, kernel, 2)
            assert got.shape == want.shape and got.stride() == want.stride(), (h, w)
            assert torch.equal(got.isnan(), want.isnan()), (h, w)
            assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), (h, w)
            checked += 1
    assert checked > 50


def test_mtcnn_networks_pool_through_it_and_answer_as_with_aten_pools():
    """The shipped networks use MaxPoolCeil; with ATen's pools swapped in, P-Net on a pyramid level of a real photo
    and R-Net / O-Net on crops of it give the same outputs to the bit."""
    nets = load_networks("cpu")
    assert sum(isinstance(m, MaxPoolCeil) for net in nets for m in net.modules()) == 6
    photo = torch.from_numpy(samples.astronaut()).permute(2, 0, 1)[None].float()    # channels-last strides
    level = (F.interpolate(photo, size=(307, 307), mode="area") - 127.5) * 0.0078125
    crops = torch.cat([F.interpolate(photo[:, :, y:y + s, x:x + s], size=(48, 48), mode="area")
                       for y, x, s in ((40, 180, 160), (0, 0, 33), (300, 250, 97), (10, 400, 111))])
    inputs = {"pnet": level, "rnet": F.interpolate(crops, size=(24, 24), mode="area"), "onet": crops}
    with torch.inference_mode():
        ours = {name: net(inputs[name]) for name, net in zip(("pnet", "rnet", "onet"), nets, strict=True)}
        for net in nets:
            for child, layer in list(net.named_children()):
                if isinstance(layer, MaxPoolCeil):
                    setattr(net, child, torch.nn.MaxPool2d(layer.kernel, layer.stride, ceil_mode=True))
        aten = {name: net(inputs[name]) for name, net in zip(("pnet", "rnet", "onet"), nets, strict=True)}
    for name in ours:
        for a, b in zip(ours[name], aten[name], strict=True):
            assert torch.equal(a, b), name
