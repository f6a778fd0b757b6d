"""The built-in objectives with batches of one's own (a DataLoader given to SpecModule)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from specformer import SpecModule, load_spec


def test_a_batch_without_labels_names_the_keys_the_objective_reads():
    module = SpecModule(load_spec("gpt-nano", overrides=["decoder.n_layers=1"]))
    ids = torch.randint(0, 512, (2, 9))
    with pytest.raises(ValueError, match=r"a batch for the causal_lm objective needs input_ids and labels "
                                         r"\(optional: attention_mask\); this one lacks labels \(it has input_ids\); "
                                         r"labels are the inputs shifted by one: input_ids=ids\[:, :-1\], labels=ids\[:, 1:\]"):
        module.objective(module, {"input_ids": ids})
    with pytest.raises(ValueError, match=r"lacks input_ids \(it has ids, labels\)$"):
        module.objective(module, {"ids": ids, "labels": ids})
    # Lightning hands a list of dataloaders' batches on as a list
    with pytest.raises(TypeError, match=r"the causal_lm objective takes a batch as a dict of tensors .*; got a list"):
        module.objective(module, [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}])
    bert = SpecModule(load_spec("bert-nano", overrides=["encoder.n_layers=1"]))
    with pytest.raises(ValueError, match=r"masked_lm objective needs input_ids and labels .* -100 elsewhere"):
        bert.objective(bert, {"input_ids": ids})


def test_seq2seq_batch_without_masks_is_all_real_tokens():
    # before, the token count read batch["attention_mask"] and failed with KeyError 'attention_mask'
    torch.manual_seed(0)
    module = SpecModule(load_spec("t5-nano", overrides=["encoder.n_layers=1", "decoder.n_layers=1"]))
    src, dec = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    labels = torch.randint(3, 40, (2, 5))
    bare = module.objective(module, {"input_ids": src, "decoder_input_ids": dec, "labels": labels})
    masked = module.objective(module, {
        "input_ids": src, "attention_mask": torch.ones_like(src), "decoder_input_ids": dec,
        "decoder_attention_mask": torch.ones_like(dec), "labels": labels,
    })
    assert (bare.n_input, bare.n_predicted) == (masked.n_input, masked.n_predicted) == (2 * 7 + 2 * 5, 10)
    torch.testing.assert_close(bare.loss, masked.loss)
    with pytest.raises(ValueError, match=r"seq2seq objective needs input_ids, decoder_input_ids and labels .*"
                                         r"lacks decoder_input_ids, labels"):
        module.objective(module, {"input_ids": src})



def test_seq2seq_takes_no_loss_on_the_decoder_s_padding():
    # as causal_lm does: a label under the decoder's padding is not a prediction. With labels
    # there, the loss and the count included the padding's outputs, which a mask left out of
    # the decoder's attention (training on right-padded rows, eager or compiled) changes
    torch.manual_seed(0)
    module = SpecModule(load_spec("t5-nano", overrides=["encoder.n_layers=1", "decoder.n_layers=1"]))
    src, dec, labels = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 6)), torch.randint(3, 40, (2, 6))
    dec_mask = torch.ones_like(dec)
    dec_mask[1, 4:] = 0
    batch = {"input_ids": src, "decoder_input_ids": dec, "decoder_attention_mask": dec_mask}
    loose = module.objective(module, {**batch, "labels": labels})
    ignored = module.objective(module, {**batch, "labels": labels.masked_fill(dec_mask == 0, -100)})
    assert loose.n_predicted == ignored.n_predicted == 10
    torch.testing.assert_close(loose.loss, ignored.loss)

def test_spec_module_trains_on_a_dataloader_of_in_memory_tensors(tmp_path):
    torch.manual_seed(0)
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1", "training.seq_len=16", "training.max_steps=3"])
    seqs = torch.stack([torch.arange(i, i + 17) % 20 for i in range(12)])
    loader = DataLoader([{"input_ids": s[:-1], "labels": s[1:]} for s in seqs], batch_size=4)
    module = SpecModule(spec)
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 3 and module.tokens_seen == 3 * 4 * 16
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
