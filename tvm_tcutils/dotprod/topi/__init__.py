"""int8 conv2d (NCHWc) and dense (packed) tensorized with 4-way dot-product instructions."""
