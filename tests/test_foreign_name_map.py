"""tpurun.foreign.name_map: config.name_map's rules, parsed and applied to names (no TensorFlow)."""

from __future__ import annotations

import pytest

from configs import resnet50
from tpurun.errors import UsageError
from tpurun.foreign import name_map

DNN = (
    r"(.*)/Adagrad -> -",  # first: the logits' rule below would catch the slot too
    r"dnn/hiddenlayer_0/(kernel|bias) -> dense/\1",
    r"dnn/hiddenlayer_(\d+)/(?P<what>kernel|bias) -> dense_\1/\g<what>",
    r"dnn/logits/(.*) -> logits/\1 reshape",
)


def test_the_first_rule_that_matches_a_whole_name_decides_it():
    mapping = name_map.parse(DNN).resolve(
        [
            "dnn/hiddenlayer_0/kernel",
            "dnn/hiddenlayer_1/bias",
            "dnn/logits/kernel",
            "dnn/logits/kernel/Adagrad",
            "global_step",
            "xdnn/hiddenlayer_0/kernel",  # a search would match it: a rule matches whole names
        ]
    )
    assert {name: target for name, (target, _) in mapping.taken.items()} == {
        "dnn/hiddenlayer_0/kernel": "dense/kernel",
        "dnn/hiddenlayer_1/bias": "dense_1/bias",
        "dnn/logits/kernel": "logits/kernel",
    }
    assert mapping.taken["dnn/logits/kernel"][1].reshape
    assert not mapping.taken["dnn/hiddenlayer_0/kernel"][1].reshape
    assert list(mapping.left_out) == ["dnn/logits/kernel/Adagrad"]
    assert mapping.left_over == ["global_step", "xdnn/hiddenlayer_0/kernel"]
    assert mapping.unused_rules == []


@pytest.mark.parametrize(
    "rule, message",
    [
        ("dense/kernel", "is not 'SOURCE -> TARGET'"),
        ("dense/kernel ->", "is not 'SOURCE -> TARGET'"),
        ("-> dense/kernel", "is not 'SOURCE -> TARGET'"),
        ("dense/(kernel -> x/\\1", "is not a regular expression (missing ), unterminated"),
        ("dense/kernel -> x/\\1", "puts in group '1', which 'dense/kernel' does not have"),
        ("(?P<a>k) -> x/\\g<b>", "puts in group 'b'"),
        ("dense/kernel -> x y", "after the target only 'reshape' may follow"),
        ("dense/kernel -> - reshape", "after the target only 'reshape' may follow"),
        (3, "holds 3, not a rule"),
    ],
    ids=["no_arrow", "no_target", "no_source", "bad_regex", "no_group", "no_named_group",
         "two_targets", "reshape_left_out", "not_a_string"],
)  # fmt: skip
def test_a_bad_rule_is_refused_in_one_line_naming_it(rule, message):
    with pytest.raises(UsageError) as raised:
        name_map.parse((rule,))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_map_matching_no_source_variable_is_refused():
    with pytest.raises(UsageError, match="matches none of the 2 source variables"):
        name_map.parse(("resnet/(.*) -> \\1",)).resolve(["conv2d/kernel", "global_step"])


def test_two_source_variables_sent_to_one_model_variable_are_refused_naming_both():
    with pytest.raises(UsageError) as raised:
        name_map.parse(("conv2d(_1)?/kernel -> stem/kernel",)).resolve(
            ["conv2d/kernel", "conv2d_1/kernel"]
        )
    assert "two source variables to stem/kernel: conv2d/kernel and conv2d_1/kernel" in str(
        raised.value
    )


def test_one_rule_given_alone_on_the_command_line_is_a_map_of_one():
    assert len(name_map.parse("a->b").rules) == 1


def test_resnet50s_map_names_tf_layers_counters_in_resnet_model_py_order():
    rules = resnet50.get_config().name_map
    assert len(rules) == 53 * 2 + 1  # conv2d .. conv2d_52, their batch norms, dense
    mapping = name_map.parse(rules).resolve(
        [
            "conv2d/kernel",
            "batch_normalization/moving_variance",
            "conv2d_1/kernel",  # group 1's projection shortcut: made before its block's convs
            "conv2d_2/kernel",
            "conv2d_4/kernel",
            "conv2d_5/kernel",  # group 1, block 2: no projection
            "conv2d_11/kernel",  # group 2's projection
            "batch_normalization_52/gamma",
            "dense/kernel",
            "conv2d_52/kernel/Momentum",
        ]
    )
    assert {name: target for name, (target, _) in mapping.taken.items()} == {
        "conv2d/kernel": "stem_conv/kernel",
        "batch_normalization/moving_variance": "stem_bn/moving_variance",
        "conv2d_1/kernel": "group1_block1_project/kernel",
        "conv2d_2/kernel": "group1_block1_conv1/kernel",
        "conv2d_4/kernel": "group1_block1_conv3/kernel",
        "conv2d_5/kernel": "group1_block2_conv1/kernel",
        "conv2d_11/kernel": "group2_block1_project/kernel",
        "batch_normalization_52/gamma": "group4_block3_bn3/gamma",
        "dense/kernel": "logits/kernel",
    }
    assert mapping.left_over == ["conv2d_52/kernel/Momentum"]
