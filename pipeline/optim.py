"""The optimizer of the acoustic model and the vocoder: Keras's AdamW, each variable's update one op.

Keras 3 writes Adam's update of a variable as ~20 elementwise ops, and recomputes the step's beta
powers and the learning-rate schedule for every variable (its weight decay too). In a small model's
training step that is most of the graph: 3,627 of the tiny test model's 5,918 nodes for 63 variables.
Every trace of the step builds them again (one per bucket shape), Grappler optimizes them on the first
call of each trace, and each step launches their kernels one by one.

`AdamW` below keeps Keras's optimizer (its slots, checkpoints, schedule, clipping, loss scaling and
tf.distribute handling) and changes two things: each float32 variable's update is TensorFlow's fused
`ResourceApplyAdam` kernel, the formula Keras writes out (alpha = lr * sqrt(1 - beta2^t) /
(1 - beta1^t); m += (g - m)(1 - beta1); v += (g^2 - v)(1 - beta2); var -= alpha m / (sqrt(v) + eps)),
and the scalars it takes are computed once per step, not once per variable. tests/test_optim.py checks
it against keras.optimizers.AdamW, step by step.
"""
import keras
import tensorflow as tf


def _tf_variable(variable):
    """The TensorFlow variable of a Keras or TensorFlow variable."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _resource(variable):
    """The resource handle of a Keras or TensorFlow variable (under a tf.distribute update: the
    current device's copy)."""
    return _tf_variable(variable).handle


class AdamW(keras.optimizers.AdamW):
    """keras.optimizers.AdamW (the same arguments) whose per-variable update is one fused op."""

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # once a step, in the caller's context (a replica's, under a strategy: passed on per device
        # by the strategy's update as Keras passes the learning rate)
        f32 = lambda x: tf.cast(x, tf.float32)  # noqa: E731
        step = f32(self.iterations + 1)
        beta_1, beta_2 = f32(self.beta_1), f32(self.beta_2)
        # (learning rate, beta1^t, beta2^t, beta1, beta2, epsilon): a plain tuple, which tf.distribute
        # splits per device as it does any nested argument
        scalars = (f32(learning_rate), tf.pow(beta_1, step), tf.pow(beta_2, step), beta_1, beta_2, f32(self.epsilon))
        super()._backend_update_step(grads, trainable_variables, scalars)

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(learning_rate, tuple):  # not through _backend_update_step: Keras's own update
            return super().update_step(gradient, variable, learning_rate)
        lr, beta_1_power, beta_2_power, beta_1, beta_2, epsilon = learning_rate
        if self.amsgrad or variable.dtype != tf.float32:
            return super().update_step(gradient, variable, lr)
        index = self._get_variable_index(variable)
        # an embedding's IndexedSlices made dense, as Keras's own update does in its arithmetic
        gradient = tf.cast(tf.convert_to_tensor(gradient), tf.float32)
        tf.raw_ops.ResourceApplyAdam(
            var=_resource(variable), m=_resource(self._momentums[index]), v=_resource(self._velocities[index]),
            beta1_power=beta_1_power, beta2_power=beta_2_power, lr=lr, beta1=beta_1, beta2=beta_2,
            epsilon=epsilon, grad=gradient)

    def _apply_weight_decay(self, variables):
        """Keras's decoupled decay (variable -= variable * weight_decay * lr, before the update), with
        the learning rate read once a step."""
        if self.weight_decay is None:
            return
        decay = tf.cast(self.weight_decay, tf.float32)
        lr = tf.cast(self.learning_rate, tf.float32)

        def decay_one(variable, decay, lr):
            variable.assign_sub(variable * tf.cast(decay, variable.dtype) * tf.cast(lr, variable.dtype))

        def apply(distribution, variables, decay, lr):
            for variable in variables:
                if self._use_weight_decay(variable):
                    distribution.extended.update(_tf_variable(variable), decay_one, args=(decay, lr), group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(apply, self._distribution_strategy, variables,
                                                            decay, lr)
