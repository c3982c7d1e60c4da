"""LeRobot pi0 as a FlowPolicy: PaliGemma prefix (images + instruction) cached once per observation; the Gemma action
expert reads the state token and the noisy chunk (``denoise_step(state, pad, kv, x_t, t)``). Value head on the
expert's output (pi_RL's pi0 critic)."""

from __future__ import annotations

from typing import Any

import torch

from .adapter import VLAEncoding, VLAPolicy


def prefix_forward(model, embs: torch.Tensor, pad_masks: torch.Tensor, att_masks: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The PaliGemma forward of LeRobot's ``sample_actions`` on the prefix alone, with the KV cache (and gradients)."""
    from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d

    att_4d = prepare_attention_masks_4d(make_att_2d_masks(pad_masks, att_masks))
    position_ids = torch.cumsum(pad_masks, dim=1) - 1
    model.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"  # as LeRobot
    (prefix_out, _), cache = model.paligemma_with_expert.forward(attention_mask=att_4d, position_ids=position_ids,
                                                                past_key_values=None, inputs_embeds=[embs, None],
                                                                use_cache=True)
    return prefix_out, cache


class PI0Adapter(VLAPolicy):
    value_on_expert = True

    def _prefix_width(self) -> int:
        return self.model.paligemma_with_expert.paligemma.config.text_config.hidden_size

    def _init_language(self) -> None:
        # LeRobot's pi0 processor ends the task with a newline, then tokenises (right padding to max_length)
        self._fixed_instruction(self.instruction, self.lerobot.config.tokenizer_max_length, suffix="\n")

    def _prefix(self, batch: dict[str, torch.Tensor], bsize: int):
        images, img_masks = self.lerobot._preprocess_images(batch)
        state = self.lerobot.prepare_state(batch)
        tokens, masks = self._instruction_tokens(batch, bsize)
        embs, pad_masks, att_masks = self.model.embed_prefix(images, img_masks, tokens, masks)
        prefix_out, cache = prefix_forward(self.model, embs, pad_masks, att_masks)
        return prefix_out, cache, pad_masks, {"state": state}

    def _denoise(self, enc: VLAEncoding, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.model.denoise_step(state=enc.extra["state"], prefix_pad_masks=enc.pad_masks,
                                       past_key_values=enc.cache(), x_t=x, timestep=t)
