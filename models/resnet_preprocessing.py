"""ImageNet preprocessing of tensorflow/tpu's ResNet (resnet_preprocessing.py), with keyed draws.

Training: the Inception crop, a random window of 8% to 100% of the image's area with
an aspect ratio (width / height) of 3/4 to 4/3, decoded alone with
`tf.image.decode_and_crop_jpeg` (only the window's blocks of the JPEG are decoded),
resized to `image_size` x `image_size` (bicubic), flipped left-right with probability
1/2. When 10 attempts find no such window the whole image would be the crop: the
eval crop is taken instead, as resnet_preprocessing does.

Eval: the centre square of side image_size / (image_size + padding) of the shorter
side (224 / 256 at 224), decoded alone, resized to image_size x image_size.

Both give float32 pixel values in [0, 255] (bicubic overshoots a little); the
model subtracts the ImageNet mean and divides by its standard deviation (MEAN_RGB,
STDDEV_RGB), on the device, as resnet_main.py's model_fn did.

Keyed draws: the window and the flip are drawn by stateless ops from a key, a
function of the run's seed and the example's place in the training stream
(`example_key`), never from a random state: a run resumed at step N draws exactly
the crops an uninterrupted one drew, whatever was read before.
"""

from __future__ import annotations

import tensorflow as tf

# resnet_main.py's normalization: ImageNet's per-channel mean and standard deviation.
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# The eval crop is image_size / (image_size + padding) of the shorter side: 224 / 256.
CROP_FRACTION = 0.875
# The Inception crop's ranges, and resnet_preprocessing's attempts at drawing one.
AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
MIN_OBJECT_COVERED = 0.1
MAX_ATTEMPTS = 10
# One box, the whole image: with no labelled boxes any window of the ranges may be drawn.
WHOLE_IMAGE = ((0.0, 0.0, 1.0, 1.0),)


def example_key(seed: int, pipeline: tf.Tensor, epoch: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """The key of an example's draws: int64 [2], a function of the run's seed, the input
    pipeline, the epoch of its stream and its index in that epoch."""
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(pipeline, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(epoch, tf.int64))
    return tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64))


def train_image(image_bytes: tf.Tensor, key: tf.Tensor, image_size: int) -> tf.Tensor:
    """A JPEG's training crop, float32 [image_size, image_size, 3]; `key` from example_key."""
    crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    shape = tf.image.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([WHOLE_IMAGE], tf.float32),
        seed=crop_key,
        min_object_covered=MIN_OBJECT_COVERED,
        aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE,
        max_attempts=MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    # No window found: the draw is the whole image (resnet_preprocessing's "bad" crop).
    whole = tf.reduce_all(tf.equal(size[:2], shape[:2]))

    def window() -> tf.Tensor:
        crop = tf.stack([begin[0], begin[1], size[0], size[1]])
        return _resized(tf.image.decode_and_crop_jpeg(image_bytes, crop, channels=3), image_size)

    image = tf.cond(whole, lambda: eval_image(image_bytes, image_size), window)
    image = tf.image.stateless_random_flip_left_right(image, flip_key)
    return tf.ensure_shape(image, [image_size, image_size, 3])


def eval_image(image_bytes: tf.Tensor, image_size: int) -> tf.Tensor:
    """A JPEG's centre crop, float32 [image_size, image_size, 3]."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    height, width = shape[0], shape[1]
    padding = round(image_size * (1 / CROP_FRACTION - 1))
    side = tf.cast(
        image_size / (image_size + padding) * tf.cast(tf.minimum(height, width), tf.float32),
        tf.int32,
    )
    top, left = (height - side + 1) // 2, (width - side + 1) // 2
    crop = tf.stack([top, left, side, side])
    image = _resized(tf.image.decode_and_crop_jpeg(image_bytes, crop, channels=3), image_size)
    return tf.ensure_shape(image, [image_size, image_size, 3])


def _resized(image: tf.Tensor, image_size: int) -> tf.Tensor:
    return tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BICUBIC)
