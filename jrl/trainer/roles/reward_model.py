"""Model-based reward (``reward_model.enable``): a classification head scores each response.

As in verl, the score lands on the last valid response token as ``rm_scores``, which the reward
manager then returns unchanged (the rule-based score is not computed for that batch). With
``reward_model.model.input_tokenizer`` set (verl's default: the actor's model path), each row's
response is decoded with that tokenizer (its EOS text removed, as verl does) and re-encoded with the
reward model's own chat template after the prompt's messages (``raw_prompt`` when
``data.return_raw_chat`` keeps them, else the decoded prompt as the user turn), right-padded or
truncated to ``reward_model.max_length`` (default: prompt + response length); with it null the
reward model reads the policy's tokens as they are.
``reward_model.model.fsdp_config.param_offload`` keeps its parameters in host memory between
scoring calls.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl.batch import Batch, attended_lengths
from jrl.data.tokenizer import load_tokenizer
from jrl.parallel import batch_sharding, place
from jrl.runspec.roles import RewardModelSettings
from jrl.trainer.roles.specs import ForwardSpec, load_model, param_offload


class RewardModel:
    """Scores a generated batch with the reward model on the mesh."""

    def __init__(self, settings: RewardModelSettings, mesh: Mesh):
        self.mesh = mesh
        model = load_model(settings.model, mesh)
        self.graphdef, params = nnx.split(model)
        self.param_shardings = jax.tree.map(lambda x: x.sharding, params)
        offload = param_offload(settings.offload, mesh)
        self.stored = offload.store(params, self.param_shardings)
        # verl's reward model splits its batch over every device, with no sequence parallelism
        self.forward = ForwardSpec.of(settings.scores, mesh, world=mesh.size, sequence_parallel=1)
        self.retemplate = settings.input_tokenizer is not None
        self.input_tokenizer = self.tokenizer = None
        if self.retemplate:  # as verl: decode with input_tokenizer, re-encode with the RM's own
            trust = settings.model.trust_remote_code
            self.input_tokenizer = load_tokenizer(settings.input_tokenizer, trust_remote_code=trust)
            self.tokenizer = load_tokenizer(settings.model.path, trust_remote_code=trust)
        self.max_length = settings.max_length
        self._forward = jax.jit(
            self._forward_fn,
            in_shardings=(self.param_shardings, batch_sharding(mesh, 2)),
            out_shardings=batch_sharding(mesh, 1),
        )

    def _forward_fn(self, params, tensors):
        model = nnx.merge(self.graphdef, params)
        return model(tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])

    def rm_scores(self, batch: Batch) -> np.ndarray:
        """[B, R] float32: each row's reward at its last attended response token (as verl
        places it: a multi-turn row's tool tokens count), zero elsewhere."""
        inputs = self._inputs(batch)
        params = place(self.stored, self.param_shardings)  # from host memory when offloaded
        scores = self.forward.run(lambda chunk, _: self._forward(params, chunk), inputs, self.mesh)
        lengths = attended_lengths(batch)[1]
        out = np.zeros(np.asarray(batch.tensors["responses"]).shape, np.float32)
        rows = np.flatnonzero(lengths > 0)
        out[rows, lengths[rows] - 1] = scores[rows]
        return out

    def _inputs(self, batch: Batch) -> dict[str, np.ndarray]:
        t = batch.tensors
        if not self.retemplate:
            return {k: np.asarray(t[k]) for k in ("input_ids", "attention_mask", "position_ids")}
        prompts, responses = np.asarray(t["prompts"]), np.asarray(t["responses"])
        prompt_mask = np.asarray(t["attention_mask"])[:, : prompts.shape[1]]
        attended = attended_lengths(batch)[1]
        length = self.max_length or prompts.shape[1] + responses.shape[1]
        ids = np.full((len(batch), length), self.tokenizer.pad_token_id, np.int32)
        mask = np.zeros((len(batch), length), np.int32)
        source = self.input_tokenizer
        raw = batch.meta.get("raw_prompt")
        for i in range(len(batch)):
            if raw is not None:  # the prompt's messages (data.return_raw_chat), as verl reads them
                chat = list(raw[i])
            else:
                prompt = source.decode(prompts[i][prompt_mask[i] > 0], skip_special_tokens=True)
                chat = [{"role": "user", "content": prompt}]
            response = source.decode(responses[i][: attended[i]])  # tool turns included
            response = response.replace(source.eos_token, "") if source.eos_token else response
            chat.append({"role": "assistant", "content": response})
            text = self.tokenizer.apply_chat_template(
                chat, add_generation_prompt=False, tokenize=False
            )
            row = self.tokenizer(text, add_special_tokens=False)["input_ids"][:length]
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        positions = np.clip(np.cumsum(mask, -1) - 1, 0, None).astype(np.int32)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
