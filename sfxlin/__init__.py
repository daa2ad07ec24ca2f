"""sfxlin: softmax attention as linear attention in the large-prompt regime."""
from ._version import __version__
