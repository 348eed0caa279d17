"""The request pipeline: the public listener, the one admission both eras pass (Origin, token,
Host, media types, body, a coordinator slot), then the modern pipeline or the 2025-era front
door, as peers; the guard and the visibility rules they share."""
