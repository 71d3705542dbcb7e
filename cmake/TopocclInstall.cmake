# install rules: populated with the api layer
