-- The tables of the CDC tutorial (docs/tutorials/postgres-cdc.md): a shop's customers
-- and orders, published for logical replication. Run with psql -f.
CREATE TABLE customers (id BIGINT PRIMARY KEY, name TEXT NOT NULL, region TEXT NOT NULL);
-- Text columns may be stored out of line (TOAST): the full old row carries them.
ALTER TABLE customers REPLICA IDENTITY FULL;
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer BIGINT NOT NULL, amount BIGINT NOT NULL);
CREATE PUBLICATION shop FOR TABLE customers, orders;

INSERT INTO customers VALUES (1, 'ada', 'east'), (2, 'bob', 'west'), (3, 'cy', 'east');
INSERT INTO orders VALUES (1, 1, 100), (2, 2, 250), (3, 3, 75), (4, 1, 30);
