"""The optimizer (pipeline/optim.py): Keras's AdamW with each variable's update one fused op.

It must be Keras's AdamW step for step (schedule, weight decay, global clipping, loss scaling, a
tf.distribute strategy), read the checkpoints Keras's wrote, and build a smaller graph.
"""
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT

from pipeline import optim
from pipeline.train import WarmupSchedule


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Embedding(5, 8), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(4)])


def _train(make_optimizer, steps=8, loss_scale=False):
    """(weights and optimizer slots after `steps` steps, the step's graph) for a small model."""
    model = _model()
    opt = make_optimizer(learning_rate=WarmupSchedule(0.01, 3), weight_decay=0.01, beta_2=0.98, global_clipnorm=0.5)
    if loss_scale:
        opt = keras.optimizers.LossScaleOptimizer(opt)
    opt.build(model.trainable_variables)
    x = tf.random.stateless_uniform([32, 8], seed=[1, 2], maxval=5, dtype=tf.int32)
    y = tf.random.stateless_normal([32, 8, 4], seed=[3, 4])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            scaled = opt.scale_loss(loss) if loss_scale else loss
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    losses = [float(step()) for _ in range(steps)]
    assert losses[-1] < losses[0]
    state = [v.numpy() for v in model.trainable_variables] + [v.numpy() for v in opt.variables]
    return state, step.get_concrete_function().graph.as_graph_def()


def _ops(graph_def):
    return [n.op for n in graph_def.node] + [n.op for f in graph_def.library.function for n in f.node_def]


@pytest.mark.parametrize("loss_scale", [False, True], ids=["adamw", "loss-scaled"])
def test_every_step_is_keras_adamws_and_each_update_one_op(loss_scale):
    keras_state, keras_graph = _train(keras.optimizers.AdamW, loss_scale=loss_scale)
    fused_state, fused_graph = _train(optim.AdamW, loss_scale=loss_scale)
    assert len(keras_state) == len(fused_state)  # the same slots, in the same order
    for a, b in zip(keras_state, fused_state):  # the same arithmetic; float rounding apart
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    ops, keras_ops = _ops(fused_graph), _ops(keras_graph)
    assert ops.count("ResourceApplyAdam") == 5  # one per variable (the embedding's gradient made dense)
    assert len(ops) < 0.6 * len(keras_ops), (len(ops), len(keras_ops))
    assert ops.count("Pow") == 2  # beta1^t and beta2^t once a step, not once per variable


def test_reads_and_writes_the_checkpoints_of_keras_adamw(tmp_path):
    model = _model()
    written = keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.01)
    written.build(model.trainable_variables)
    for k, v in enumerate(written.variables):
        v.assign(tf.fill(v.shape, float(k + 1)) if v.dtype == tf.float32 else tf.cast(7, v.dtype))
    prefix = tf.train.Checkpoint(model=model, optimizer=written).save(str(tmp_path / "ckpt"))
    read = optim.AdamW(learning_rate=0.01, weight_decay=0.01)
    read.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=read).restore(prefix).assert_consumed()
    assert [v.numpy().tolist() for v in read.variables] == [v.numpy().tolist() for v in written.variables]


# Two logical CPUs stand in for two GPUs; they must be set before TensorFlow starts: a process of its own.
MIRRORED = """
    import keras, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from pipeline import optim
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
    def train(cls):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
            opt = cls(learning_rate=0.01, weight_decay=0.01, beta_2=0.98)
            opt.build(model.trainable_variables)
        x = tf.random.stateless_normal([16, 8], seed=[1, 2])
        y = tf.random.stateless_normal([16, 4], seed=[3, 4])
        data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)).repeat())
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2) / strategy.num_replicas_in_sync
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        step = tf.function(lambda batch: strategy.run(replica_step, args=batch))
        batches = iter(data)
        for _ in range(5):
            step(next(batches))
        graph = step.get_concrete_function(next(batches)).graph.as_graph_def()
        ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
        print(cls.__module__, "fused updates", ops.count("ResourceApplyAdam"))
        return [[t.numpy() for t in v.value.values] for v in model.trainable_variables]
    a, b = train(keras.optimizers.AdamW), train(optim.AdamW)
    print("replicas", {len(v) for v in b})
    print("replicas equal", all(np.array_equal(v[0], v[1]) for v in b))
    print("max difference", max(float(np.abs(x - y).max()) for u, w in zip(a, b) for x, y in zip(u, w)))
"""


def test_under_a_mirrored_strategy_every_replica_takes_keras_adamws_step():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(MIRRORED)], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines())
    assert lines["pipeline.optim fused updates"] == "8"  # 4 variables on each of the 2 replicas
    assert lines["replicas"] == "{2}" and lines["replicas equal"] == "True"
    assert float(lines["max difference"]) < 1e-6


@pytest.mark.parametrize("options", [{"amsgrad": True}, {"exclude": "kernel"}, {"dtype": "float64"}, {"direct": True}],
                         ids=["amsgrad", "excluded-from-decay", "float64", "update_step-called"])
def test_keras_adamws_other_arguments_and_calls_give_keras_adamws_steps(options):
    """Arguments and calls the pipeline's trainers do not use are still Keras's AdamW: amsgrad, variables
    excluded from the weight decay, float64 variables, update_step called with a plain learning rate."""
    dtype = options.get("dtype", "float32")

    def train(cls):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", dtype=dtype),
                                  keras.layers.Dense(4, dtype=dtype)])
        # a decay large enough that a variable decayed or not differs far beyond float rounding
        opt = cls(learning_rate=0.01, weight_decay=0.5, beta_2=0.98,
                  amsgrad=options.get("amsgrad", False))
        if "exclude" in options:
            opt.exclude_from_weight_decay(var_names=[options["exclude"]])
        opt.build(model.trainable_variables)
        x = tf.random.stateless_normal([16, 8], seed=[1, 2], dtype=dtype)
        y = tf.random.stateless_normal([16, 4], seed=[3, 4], dtype=dtype)
        for _ in range(4):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            if options.get("direct"):
                for g, v in zip(grads, model.trainable_variables):
                    opt.update_step(g, v, 0.01)
            else:
                opt.apply(grads, model.trainable_variables)
        return [v.numpy() for v in model.trainable_variables] + [v.numpy() for v in opt.variables]

    keras_state, state = train(keras.optimizers.AdamW), train(optim.AdamW)
    assert len(keras_state) == len(state)
    for a, b in zip(keras_state, state):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
