"""`xlgen.models.layers.Dropout`: the counter-hash keep mask keeps nnx.Dropout's semantics."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from xlgen.models.layers import Dropout


def test_dropout_mask_statistics_determinism_and_sharding():
    x = jnp.ones((64, 512), jnp.float32)
    a, b = Dropout(0.25, rngs=nnx.Rngs(dropout=3)), Dropout(0.25, rngs=nnx.Rngs(dropout=3))
    y1, y2, z1 = a(x), a(x), b(x)
    kept = np.asarray(y1) != 0
    assert abs(kept.mean() - 0.75) < 0.01  # P(keep) = 1 - rate
    np.testing.assert_array_equal(
        np.asarray(y1)[kept], np.float32(1) / np.float32(0.75)
    )  # kept values rescaled, others zero
    np.testing.assert_array_equal(y1, z1)  # a pure function of the stream's key...
    assert (np.asarray(y1) != np.asarray(y2)).mean() > 0.2  # ...which advances per call
    # neighbouring elements and the two calls are uncorrelated
    k1, k2 = kept.ravel().astype(float), (np.asarray(y2) != 0).ravel().astype(float)
    assert abs(np.corrcoef(k1[:-1], k1[1:])[0, 1]) < 0.02 and abs(np.corrcoef(k1, k2)[0, 1]) < 0.02
    # broadcast_dims share the mask; deterministic / eval mode is the identity
    r = Dropout(0.5, broadcast_dims=(0,), rngs=nnx.Rngs(dropout=0))(x)
    assert (np.asarray(r) == np.asarray(r)[:1]).all()
    e = Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    e.eval()
    np.testing.assert_array_equal(e(x), x)
    # the same mask when the input is sharded over 8 devices (the global element index seeds each element)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    c = Dropout(0.25, rngs=nnx.Rngs(dropout=3))
    ys = nnx.jit(lambda m, v: m(v))(c, xs)
    np.testing.assert_array_equal(np.asarray(ys), np.asarray(y1))
