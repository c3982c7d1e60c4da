"""LeRobot SmolVLA as a FlowPolicy: SmolVLM prefix (images, instruction, state token) cached once per observation; the
action expert cross-attends to it (``denoise_step(pad, kv, x_t, t)``, which appends and then crops its K/V: each of our
calls gets a fresh cache over the stored prefix). Value head on the mean of the VLM's prefix output, as for pi0.5."""

from __future__ import annotations

import torch

from .adapter import VLAEncoding, VLAPolicy


class SmolVLAAdapter(VLAPolicy):
    value_on_expert = False

    def _prefix_width(self) -> int:
        return self.model.vlm_with_expert.config.text_config.hidden_size

    def _init_language(self) -> None:
        # LeRobot's SmolVLA processor ends the task with a newline, then tokenises (right padding)
        self._fixed_instruction(self.instruction, self.lerobot.config.tokenizer_max_length,
                                self.lerobot.config.pad_language_to, suffix="\n")

    def _prefix(self, batch: dict[str, torch.Tensor], bsize: int):
        from lerobot.policies.common.vla_utils import make_att_2d_masks

        images, img_masks = self.lerobot.prepare_images(batch)
        state = self.lerobot.prepare_state(batch)
        tokens, masks = self._instruction_tokens(batch, bsize)
        embs, pad_masks, att_masks = self.model.embed_prefix(images, img_masks, tokens, masks, state=state)
        att_2d = make_att_2d_masks(pad_masks, att_masks)
        position_ids = torch.cumsum(pad_masks, dim=1) - 1
        outs, cache = self.model.vlm_with_expert.forward(attention_mask=att_2d, position_ids=position_ids,
                                                         past_key_values=None, inputs_embeds=[embs, None], use_cache=True)
        return outs[0], cache, pad_masks, {}

    def _denoise(self, enc: VLAEncoding, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.model.denoise_step(prefix_pad_masks=enc.pad_masks, past_key_values=enc.cache(), x_t=x, timestep=t)
