"""models.py: the long-input baselines LED and LongT5 build at the size of BART and T5 and take a training step;
they are opt-in names of bench_train.py and bench_quality.py only."""

import pytest
import torch


def test_long_baselines_configs(import_benchmark):
    models = import_benchmark("models")
    size = models.ModelSize(vocab_size=1000, d_model=64, layers=2, heads=4, ffn_dim=128)
    configs = models.model_configs(size, 1024, ["bart", "t5", "led", "longt5"], longest_source=1300,
                                   longest_target=100)
    bart, t5, led, longt5 = configs.values()
    assert (led.d_model, led.encoder_layers, led.decoder_layers, led.encoder_attention_heads, led.encoder_ffn_dim,
            led.vocab_size) == (bart.d_model, bart.encoder_layers, bart.decoder_layers, bart.encoder_attention_heads,
                                bart.encoder_ffn_dim, bart.vocab_size)
    assert led.attention_window == [512, 512]
    assert led.max_encoder_position_embeddings == 1536  # 1300 rounded up to the window
    assert led.max_decoder_position_embeddings >= 100
    assert (longt5.d_model, longt5.d_kv, longt5.d_ff, longt5.num_layers, longt5.num_decoder_layers, longt5.num_heads,
            longt5.vocab_size) == (t5.d_model, t5.d_kv, t5.d_ff, t5.num_layers, t5.num_decoder_layers, t5.num_heads,
                                   t5.vocab_size)
    assert (longt5.encoder_attention_type, longt5.local_radius, longt5.global_block_size) == (
        "transient-global", 127, 16)
    assert (longt5.relative_attention_num_buckets, longt5.relative_attention_max_distance) == (
        t5.relative_attention_num_buckets, t5.relative_attention_max_distance)
    assert models.quadratic_in_length("bart") and not models.quadratic_in_length("led")
    assert not models.quadratic_in_length("longt5") and models.grows_with_position("led")


@pytest.mark.parametrize("name", ["led", "longt5"])
def test_long_baselines_step(import_benchmark, name):
    """One forward + backward on a tiny padded batch shorter than LED's window, then greedy decoding."""
    models = import_benchmark("models")
    size = models.ModelSize(vocab_size=200, d_model=32, layers=1, heads=2, ffn_dim=64)
    model = models.build_seq2seq(name, 0, size, 0.1, 128, longest_source=40, longest_target=20).train()
    assert models.parse_model_name(name, models.ALL_BASELINES) == models.ModelSpec(name, None)
    input_ids, attention_mask, labels = models.collate([[5, 6, 7] * 13, [8, 9] * 5], [[10, 11, 2], [12, 2]])
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False).loss
    loss.backward()
    assert torch.isfinite(loss) and model.lm_head.weight.grad is not None
    encoder = [p for n, p in model.get_encoder().named_parameters() if "embed" not in n and "shared" not in n]
    assert encoder and any(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder)
    generated = model.eval().generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                                      num_beams=1, max_new_tokens=4, decoder_start_token_id=models.BOS_ID,
                                      eos_token_id=models.EOS_ID, pad_token_id=models.PAD_ID)
    assert generated.shape[0] == 2 and generated.shape[1] <= 5


def test_long_baselines_are_opt_in(import_benchmark, run_main):
    models = import_benchmark("models")
    assert "led" not in models.MODEL_NAMES and "longt5" not in models.MODEL_NAMES  # bench_generate's names
    assert {"led", "longt5"} <= set(models.TRAIN_MODEL_NAMES)
    with pytest.raises(ValueError, match="unknown model"):
        models.parse_model_name("led")  # bench_extrapolation's names: bart, t5 and Scaleformer
    with pytest.raises(ValueError, match="unknown model"):
        models.parse_model_name("led+post_ln", models.ALL_BASELINES)
    result = run_main(["benchmarks/bench_generate.py", "--quick", "--models", "scaleformer", "led"])
    assert result.returncode == 2 and "'led'" in result.stderr
