"""The tiny fixtures' tokenizer: a byte-level BPE trained offline on a built-in corpus.

Both fixtures (``tiny-qwen2-vl`` and ``tiny-llama``) share it. :func:`train_tokenizer` learns
:data:`BPE_VOCAB_SIZE` byte-level BPE tokens (256 byte symbols plus merges) from
:data:`CORPUS`, then appends :data:`SPECIAL_TOKENS` in that order, so the special tokens take the
last ids, as in the real Qwen2 vocabulary. Training is deterministic: the corpus is fixed, and
the ``tokenizers`` BPE trainer breaks ties between equally frequent pairs by the pair itself.

:data:`CHAT_TEMPLATE` is a ChatML template in the Qwen2-VL style, without a default system
prompt: a message renders as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``, where list content
renders ``{"type": "text", "text": ...}`` parts as their text and image parts as
``<|vision_start|><|image_pad|><|vision_end|>`` (video parts likewise with ``<|video_pad|>``);
``add_generation_prompt`` appends ``<|im_start|>assistant\\n``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BPE_VOCAB_SIZE = 480
"""Size of the trained byte-level vocabulary, before the special tokens are appended."""

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Qwen2-VL's special tokens, in the order they receive ids after the trained vocabulary."""

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}"
    "{{ part['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% endif %}"
)

CORPUS = """\
The lighthouse keeper climbed the stairs every evening at six. There were one hundred and
twelve steps, and she counted each of them, because counting kept her mind on the work. At the
top she cleaned the glass, trimmed the wick, and wrote the weather in a small green book.
Tonight the sky was grey, the wind came from the west, and the sea was calm.

A picture shows a red bicycle leaning against a white wall. The front wheel is turned to the
left. A small dog sits in the shadow of the bicycle and looks at the camera. Behind the wall
there is a tree with yellow leaves, and the sky above it is a pale blue.

User: What is in the image?
Assistant: The image shows a cat sleeping on a blue chair near a window.
User: What color is the cat?
Assistant: The cat is orange with white paws and a white patch on its chest.
User: Describe the second picture.
Assistant: The second picture shows a street at night. The lights are on in the shops, and
two people are walking under an umbrella because it is raining.

To make bread, mix four cups of flour with one spoon of salt and one spoon of yeast. Add two
cups of warm water and stir until the dough is smooth. Let it rest for one hour, then shape it
into a loaf and bake it for forty minutes. The crust should be brown and the inside soft.

The river starts in the mountains as a thin stream of cold water. It runs between the rocks,
through a forest of pine trees, and past a village where children play on the bridge. By the
time it reaches the sea, it is wide and slow, and large ships can travel on it.

A square has four equal sides and four right angles. A circle has no corners at all. A
triangle has three sides, and the sum of its angles is one hundred and eighty degrees. If you
draw a line from one corner of a square to the opposite corner, you get two triangles.

The train leaves the station at nine in the morning and arrives in the city at noon. On the
way it crosses three rivers and stops in five small towns. Most passengers read, some sleep,
and a few look out of the window at the fields, the farms and the cows.

Please answer the question in one short sentence. Then explain your answer step by step. If
you are not sure, say that you are not sure. Do not guess the number of objects in a picture;
count them one by one, from left to right and from top to bottom.

The museum has a large room full of old maps. Some maps show the world as people imagined it
long ago, with strange animals drawn in the empty parts of the ocean. Others are precise, with
every coast and island measured carefully by ships that sailed for years.

In the garden there are roses, tulips and a row of green beans. The gardener waters them early
in the morning, before the sun is hot. Birds come to eat the seeds, so she has put a small net
over the beans and a bowl of water for the birds near the fence.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 100 128 256 1000. The year has 12 months, the week
has 7 days, and the day has 24 hours. A block of 16 tokens, a picture of 64 by 64 pixels, and
a patch of 8 by 8 pixels are small things, but many small things make a large one.

The kitchen smells of coffee and toast. A radio plays quiet music on the shelf. Someone has
left a note on the table: "Back at ten. Please feed the cat and close the window if it rains."
The cat, of course, has already eaten, but it will not say so.

Questions and answers help us learn. Why is the sky blue? Because the air scatters blue light
more than red light. Why do leaves fall in autumn? Because the tree stops feeding them to save
water and energy for the winter. Why does the moon change shape? Because we see different
parts of its bright side as it moves around the earth.
"""
"""A few KB of plain English the BPE is trained on; fixed, so the vocabulary is reproducible."""


def train_tokenizer() -> Tokenizer:
    """Train the byte-level BPE on :data:`CORPUS` and append :data:`SPECIAL_TOKENS`.

    Returns:
        A ``tokenizers.Tokenizer`` with ``BPE_VOCAB_SIZE + len(SPECIAL_TOKENS)`` tokens.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    if tokenizer.get_vocab_size() != BPE_VOCAB_SIZE:
        raise RuntimeError(
            f"the BPE trainer produced {tokenizer.get_vocab_size()} tokens, expected "
            f"{BPE_VOCAB_SIZE}; extend CORPUS or lower BPE_VOCAB_SIZE"
        )
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    return tokenizer


def save_tokenizer(out_dir: Path) -> dict[str, int]:
    """Write the tokenizer files and the chat template into ``out_dir``.

    Writes ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja`` (through
    ``PreTrainedTokenizerFast.save_pretrained``) and ``chat_template.json`` (read by mlx-vlm's
    processors).

    Returns:
        The id of every special token, by token.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_tokenizer()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    wrapped.save_pretrained(str(out_dir))
    # transformers 5 names its own class ("TokenizersBackend") and keeps the template only in
    # chat_template.jinja; name the class both 4.x and 5.x know and keep a copy of the template
    # in tokenizer_config.json too, as the published Qwen2-VL checkpoints do.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    write_json(config_path, dict(sorted(config.items())))
    write_json(out_dir / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    ids: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise RuntimeError(f"special token {token!r} is missing from the trained tokenizer")
        ids[token] = token_id
    return ids


def vocab_size() -> int:
    """Number of tokens in the fixtures' tokenizer, special tokens included."""
    return BPE_VOCAB_SIZE + len(SPECIAL_TOKENS)


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as indented JSON with keys in insertion order and a final newline."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
